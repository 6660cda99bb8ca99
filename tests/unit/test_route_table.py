"""The route table: exact paths, one-segment and rest-of-path parameters, the fallback."""

from __future__ import annotations

from boundedcode_gateway.ingress.table import Request, Route, RouteTable


async def _nothing(request: Request) -> None:
    return None


EXACT = Route(_nothing)
TASK = Route(_nothing)
MODEL = Route(_nothing)
FALLBACK = Route(_nothing)


def _table() -> RouteTable:
    return RouteTable(
        [
            ("/v1/messages", EXACT),
            ("/v1/messages", FALLBACK),  # added again: the first stands
            ("/tasks/{task}/v1/messages", TASK),
            ("/v1/models/{name:path}", MODEL),
        ],
        fallback=FALLBACK,
    )


def test_an_exact_path_is_its_route_without_parameters() -> None:
    route, params = _table().match("/v1/messages")
    assert route is EXACT and dict(params) == {}


def test_a_segment_parameter_takes_one_segment_even_an_empty_one() -> None:
    table = _table()
    route, params = table.match("/tasks/t-1/v1/messages")
    assert route is TASK and params == {"task": "t-1"}
    assert table.match("/tasks//v1/messages")[1] == {"task": ""}
    assert table.match("/tasks/a/b/v1/messages")[0] is FALLBACK


def test_a_path_parameter_takes_the_rest_slashes_and_line_breaks_too() -> None:
    table = _table()
    route, params = table.match("/v1/models/org/model\nx")
    assert route is MODEL and params == {"name": "org/model\nx"}
    route, params = table.match("/v1/models/")
    assert route is MODEL and params == {"name": ""}


def test_a_path_no_route_has_is_the_fallbacks() -> None:
    route, params = _table().match("/v1/model")
    assert route is FALLBACK and dict(params) == {}
