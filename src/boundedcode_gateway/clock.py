"""The gateway's timestamps: UTC, ISO 8601 with milliseconds and a Z."""

from __future__ import annotations

from datetime import UTC, datetime


def utc_now_iso() -> str:
    """Now, as every record and ledger row writes a time."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def utc_iso(seconds: float) -> str:
    """A moment given as seconds since the epoch, in the same form."""
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
