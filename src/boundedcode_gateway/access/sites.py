"""Requests a web page may have sent: the Host, Origin and Content-Type checks.

A page in the user's browser can send a "simple" cross-site POST (a text/plain,
form or typeless body, no preflight) to a gateway on the user's machine, and
after DNS rebinding (its own name now resolving to 127.0.0.1) read the answers
as if they were its own. Three checks, all on headers, stop both:

- ``Host`` must name the gateway: a loopback name or address, the address it
  was told to listen on, or one of ``limits.allowed_hosts``. A rebound page's
  requests carry its own name. The port is not compared: tunnels and port
  mappings change it, rebinding changes the name.
- An ``Origin`` header, sent by browsers only, must name such a host too.
- A chat request's body must be declared ``application/json``, which a page can
  only send after a CORS preflight the gateway never grants.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from boundedcode_gateway.errors import Forbidden, GatewayError

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
JSON_MEDIA_TYPE = "application/json"
_SHOWN_CHARS = 100


class UnsupportedMediaType(GatewayError):
    status = 415
    error_type = "invalid_request_error"
    default_code = "unsupported_media_type"


def host_name(host: str) -> str:
    """A host as compared: lower case, without brackets and a trailing dot."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host.rstrip(".")


def _address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def canonical_host(host: str) -> str:
    """``host_name``, and an address in its one written form (``0:0::1`` → ``::1``)."""
    name = host_name(host)
    address = _address(name)
    return name if address is None else str(address)


def is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1`` (as a listening address or a Host)."""
    name = host_name(host)
    if name in LOOPBACK_NAMES:
        return True
    address = _address(name)
    return address is not None and address.is_loopback


def is_wildcard(host: str) -> bool:
    """Whether listening on ``host`` means every address of the machine (``0.0.0.0``, ``::``)."""
    name = host_name(host)
    address = _address(name)
    return name == "" or (address is not None and address.is_unspecified)


def _header_host(value: str) -> str:
    """The host of a ``Host`` header value: ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``."""
    value = value.strip()
    if value.startswith("["):
        return host_name(value[: value.find("]") + 1])
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return host_name(value)


def _shown(value: str) -> str:
    return value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"


# where the gateway listens unless told otherwise (``serve --host``)
DEFAULT_LISTEN_HOST = "127.0.0.1"


class SitePolicy:
    """The hosts this gateway answers to, built once from where it listens and the config."""

    __slots__ = ("_any_ip", "_names")

    def __init__(self, listen_host: str, allowed_hosts: Iterable[str] = ()) -> None:
        names = {*LOOPBACK_NAMES, *(canonical_host(h) for h in allowed_hosts)}
        # a wildcard listener is reached by any of the machine's addresses; a Host that
        # is an address cannot come from a rebound name
        self._any_ip = is_wildcard(listen_host)
        if not self._any_ip:
            names.add(canonical_host(listen_host))
        self._names = frozenset(names)

    def _named(self, name: str) -> bool:
        # the common Host (127.0.0.1, localhost) is found without parsing an address
        return name in self._names or canonical_host(name) in self._names or is_loopback(name)

    def check(self, host: str | None, origin: str | None) -> None:
        """A 403 when the ``Host`` or ``Origin`` names a site other than this gateway.

        A missing ``Host`` passes: browsers always send one, HTTP/1.0 clients may not.
        """
        if host is not None:
            name = _header_host(host)
            if not (self._named(name) or (self._any_ip and _address(name) is not None)):
                raise Forbidden(
                    f"The Host '{_shown(host)}' is not an address of this gateway; if it is "
                    "reached by that name, add the name to limits.allowed_hosts",
                    code="host_not_allowed",
                )
        if origin is not None and not self._named(_origin_host(origin)):
            raise Forbidden(
                f"Requests from the web page at '{_shown(origin)}' are not accepted",
                code="origin_not_allowed",
            )


def _origin_host(origin: str) -> str:
    """The host of an ``Origin`` value; '' for ``null`` or anything unreadable."""
    try:
        return host_name(urlsplit(origin.strip()).hostname or "")
    except ValueError:
        return ""


def check_json_body(content_type: str | None) -> None:
    """A 415 unless the body is declared ``application/json`` (parameters allowed)."""
    media = (content_type or "").partition(";")[0].strip().lower()
    if media != JSON_MEDIA_TYPE:
        raise UnsupportedMediaType(
            f"Send the request body as JSON with 'Content-Type: {JSON_MEDIA_TYPE}'"
            + (f", not '{_shown(content_type)}'" if content_type else ""),
            param="Content-Type",
        )
