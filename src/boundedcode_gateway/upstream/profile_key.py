"""The credentials a profile's own requests carry: its ``api_key_env`` as a Bearer token."""

from __future__ import annotations

from boundedcode_gateway.config import ModelProfile
from boundedcode_gateway.errors import MissingApiKey


def bearer_headers(name: str, profile: ModelProfile) -> dict[str, str]:
    """``Authorization: Bearer`` with the profile's key, none without one; a key it names
    but the environment lacks is a clear 500 naming the variable."""
    key = profile.api_key()
    if profile.api_key_env and key is None:
        raise MissingApiKey(
            f"model '{name}' needs the environment variable {profile.api_key_env}, which is not set"
        )
    return {"Authorization": f"Bearer {key}"} if key else {}
