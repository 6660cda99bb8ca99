"""What a thinking block's signature covers: its text and the profile that wrote it.

The gateway signs (``Sealer.sign``) the pair, so a block goes back only to the model
that wrote it: given back in a request for another profile, its signature does not
verify and it is dropped (docs/reasoning.md, Provenance), as the Responses front's
sealed reasoning opens to nothing for another profile. The sealer bound to the call
adds its task, caller scope, key id and time (fronts/sealing.py).
"""

from __future__ import annotations


def signed_text(profile: str, thinking: str) -> str:
    """The text whose signature a thinking block of ``profile`` carries."""
    return profile + "\x00" + thinking
