"""What each Anthropic API version (``anthropic-version``) refuses of a translated request.

A leaf table, the facts of Anthropic's versioning page: the request translation asks it
which fields to leave out, so no version's rules are written into the translation's code.
Of what ``2026-10-21`` refuses, only its removed sampling parameters can come out of an
OpenAI-shaped request: the translation never writes a ``document`` block into an
assistant turn, nor ``citations`` on a user's text.
"""

from __future__ import annotations

from boundedcode_gateway.provider_kinds import ANTHROPIC_VERSIONS

NEWEST = ANTHROPIC_VERSIONS[0]
# the sampling parameters the translation writes when the caller sets them
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")
# request fields a version removed: a request that sends one is a 400, even at its default
REMOVED_FIELDS: dict[str, frozenset[str]] = {
    "2026-10-21": frozenset(SAMPLING_FIELDS),
    "2023-06-01": frozenset(),
}


def removed_fields(version: str) -> frozenset[str]:
    """The fields ``version`` refuses; a version the table does not know is read as the
    newest (the configuration admits only known ones)."""
    return REMOVED_FIELDS.get(version, REMOVED_FIELDS[NEWEST])
