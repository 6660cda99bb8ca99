"""Whether the gateway may listen where it is asked to: off the loopback only with keys."""

from __future__ import annotations

from boundedcode_gateway.access.sites import is_loopback
from boundedcode_gateway.config import AuthSettings

INSECURE_FLAG = "--insecure-no-auth"


def listen_refusal(host: str, auth: AuthSettings | None, insecure_no_auth: bool) -> str | None:
    """Why serving on ``host`` is refused, or None when it may go ahead.

    Any address but loopback (``127.0.0.0/8``, ``::1``, ``localhost``) is reachable
    by the neighbours on the network; without ``auth:`` each of them could spend the
    gateway's cloud keys and read what it answers.
    """
    if auth is not None or insecure_no_auth or is_loopback(host):
        return None
    return (
        f"refusing to listen on {host} without caller keys: anyone who can reach that "
        "address could use every model. Create a key with "
        "`boundedcode-gateway key new --name NAME` and add the lines it prints to the "
        f"configuration (auth:), or pass {INSECURE_FLAG} to serve without keys anyway."
    )
