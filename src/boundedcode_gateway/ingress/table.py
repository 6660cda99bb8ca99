"""The routes as a table: a path, or a path pattern, to the route that answers it.

A pattern names its parameters in braces: ``{task}`` is one path segment (empty
too), ``{name:path}`` the rest of the path, slashes and all. A path is looked up
among the exact paths first, then tried against the patterns in the order they
were added; for a path added twice the first route stands.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from boundedcode_gateway.asgi.render import Receive, Send
from boundedcode_gateway.call_context import Caller
from boundedcode_gateway.fronts.base import Front
from boundedcode_gateway.live_config import LiveConfig

_NO_PARAMS: Mapping[str, str] = MappingProxyType({})
_PARAM = re.compile(r"\{(\w+)(:path)?\}")


class Access(enum.Enum):
    """The checks a request passes before its handler runs."""

    # none: answered to anyone (it tells nothing)
    PUBLIC = "public"
    # where it comes from, then the caller's key
    CALLER = "caller"
    # where it comes from, then a viewer's key (a browser's, as HTTP Basic's password too)
    VIEWER = "viewer"


@dataclass(frozen=True, slots=True)
class Request:
    """One request as its handler gets it, past its route's checks."""

    scope: dict[str, Any]
    receive: Receive
    send: Send
    # the path's parameters, by the names in its pattern
    params: Mapping[str, str]
    # one configuration for the whole request, whatever a reload does meanwhile
    live: LiveConfig
    caller: Caller | None
    host: str | None
    origin: str | None
    authorization: str | None
    content_type: str | None

    @property
    def path(self) -> str:
        return str(self.scope["path"])


Handler = Callable[[Request], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Route:
    handler: Handler
    # None: any method (the handler decides)
    methods: frozenset[str] | None = None
    access: Access = Access.CALLER
    # the API a call of this route speaks: its errors are worded in it (None: OpenAI's)
    front: Front | None = None


class RouteTable:
    """Finds the route of a path; ``fallback`` answers a path no route has."""

    def __init__(self, routes: Iterable[tuple[str, Route]], fallback: Route) -> None:
        self._exact: dict[str, Route] = {}
        # (the literal start of the pattern, the pattern, its route)
        self._patterns: list[tuple[str, re.Pattern[str], Route]] = []
        self._fallback = fallback
        for path, route in routes:
            self._add(path, route)

    def match(self, path: str) -> tuple[Route, Mapping[str, str]]:
        """The route of ``path`` and the parameters its pattern took from it."""
        route = self._exact.get(path)
        if route is not None:
            return route, _NO_PARAMS
        for start, pattern, route in self._patterns:
            if path.startswith(start):
                found = pattern.fullmatch(path)
                if found is not None:
                    return route, found.groupdict()
        return self._fallback, _NO_PARAMS

    def _add(self, path: str, route: Route) -> None:
        if "{" not in path:
            self._exact.setdefault(path, route)
            return
        parts: list[str] = []
        end = 0
        for param in _PARAM.finditer(path):
            parts.append(re.escape(path[end : param.start()]))
            parts.append(f"(?P<{param[1]}>{'.*' if param[2] else '[^/]*'})")
            end = param.end()
        parts.append(re.escape(path[end:]))
        # DOTALL: a path is percent-decoded, so it may hold a line break
        pattern = re.compile("".join(parts), re.DOTALL)
        self._patterns.append((path[: path.index("{")], pattern, route))
