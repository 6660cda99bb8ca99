"""The request headers of the Messages API that change the rules a body is read by
(pure): ``anthropic-version`` and ``anthropic-beta``.

Anthropic serves two versions. ``2023-06-01`` takes the sampling parameters;
``2026-10-21`` (what the SDKs' new majors send) refuses ``temperature``, ``top_p`` and
``top_k`` even at their defaults, a ``document`` block in an assistant message and
non-empty ``citations`` on a user's text block. A dated version after the newest known
is served by the newest rules and says so in the record's ``adjustments``; anything
else is refused as Anthropic refuses it.

Betas: none needs the header to be served here. A beta changes what a request may
hold, and each such field or block is served, ignored or refused by name where it comes
(request.py), whichever betas the header names; a beta that changes nothing the gateway
serves is ignored. docs/fronts.md lists them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from boundedcode_gateway.errors import InvalidRequest

VERSION_HEADER = "anthropic-version"
BETA_HEADER = "anthropic-beta"
LEGACY = "2023-06-01"
NEWEST = "2026-10-21"
# the versions of the Messages API this front speaks, oldest first
VERSIONS = (LEGACY, NEWEST)
# the record's note for a version newer than the known ones, served as the newest
NEWER_VERSION_ADJUSTMENT = "anthropic_version_served_as"

_DATED = re.compile(r"\d{4}-\d{2}-\d{2}")


@dataclass(frozen=True, slots=True)
class RequestRules:
    """The rules one request is read by."""

    version: str = LEGACY
    # the version the caller named, where it is newer than any the gateway knows
    newer: str | None = None
    betas: frozenset[str] = frozenset()

    @property
    def takes_sampling(self) -> bool:
        """``temperature``, ``top_p`` and ``top_k`` are fields of this version."""
        return self.version == LEGACY

    @property
    def strict_blocks(self) -> bool:
        """A ``document`` in an assistant message and citations on a user's text block
        are refused (2026-10-21)."""
        return self.version != LEGACY

    def adjustments(self) -> dict[str, str]:
        return {NEWER_VERSION_ADJUSTMENT: f"{self.newer}→{self.version}"} if self.newer else {}


def _version(value: str | None) -> tuple[str, str | None]:
    if value is None:
        raise InvalidRequest(
            f"{VERSION_HEADER}: header is required", param=VERSION_HEADER, code="missing_header"
        )
    if value in VERSIONS:
        return value, None
    if _DATED.fullmatch(value) and value > NEWEST:
        return NEWEST, value
    shown = value[:40].replace('"', '\\"')
    raise InvalidRequest(
        f'{VERSION_HEADER}: "{shown}" is not a valid version',
        param=VERSION_HEADER,
        code="invalid_version",
    )


def _betas(value: str | None) -> frozenset[str]:
    if not value:
        return frozenset()
    return frozenset(b.strip() for b in value.split(",") if b.strip())


def request_rules(headers: Mapping[str, str]) -> RequestRules:
    """The rules of a request with these headers (lower-case names); a 400 in
    Anthropic's words for a version it does not serve."""
    version, newer = _version(headers.get(VERSION_HEADER))
    return RequestRules(version, newer, _betas(headers.get(BETA_HEADER)))
