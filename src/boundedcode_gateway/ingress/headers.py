"""A request's headers, read from its ASGI scope."""

from __future__ import annotations

from typing import Any


def header(scope: dict[str, Any], name: bytes) -> str | None:
    """The first header of ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


def access_headers(
    scope: dict[str, Any],
) -> tuple[str | None, str | None, str | None, str | None]:
    """(Host, Origin, Authorization, Content-Type), found in one pass over the headers."""
    host = origin = authorization = content_type = None
    for key, value in scope["headers"]:
        if key == b"host":
            host = value.decode("latin-1")
        elif key == b"origin":
            origin = value.decode("latin-1")
        elif key == b"authorization":
            authorization = value.decode("latin-1")
        elif key == b"content-type":
            content_type = value.decode("latin-1")
    return host, origin, authorization, content_type


def headers_of(scope: dict[str, Any]) -> dict[str, str]:
    """The request's headers by lower-case name (the last of repeated ones)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
