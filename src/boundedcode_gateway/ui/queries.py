"""The page's questions, read from a query string and checked: a bad value is a 400
naming the parameter, never a query the ledger cannot answer."""

from __future__ import annotations

from datetime import UTC, datetime
from urllib.parse import parse_qs

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.metering.ledger_queries import CallFilter

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# a task picker's page of tasks
DEFAULT_TASKS = 200
MAX_TEXT = 256
STATUSES = frozenset({"ok", "error", "abandoned"})
_CALL_PARAMS = frozenset({"task", "purpose", "model", "status", "since", "before", "limit"})
_TASK_PARAMS = frozenset({"q", "limit"})


def query_values(query_string: bytes, allowed: frozenset[str]) -> dict[str, str]:
    """One value per parameter (the last one given); an unknown parameter is refused, so a
    misspelt filter is not silently ignored."""
    try:
        parsed = parse_qs(query_string.decode("ascii"), keep_blank_values=True, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("the query string is not valid", code="invalid_query") from None
    unknown = sorted(set(parsed) - allowed)
    if unknown:
        raise InvalidRequest(
            f"unknown query parameter '{unknown[0][:64]}' (known: {', '.join(sorted(allowed))})",
            param=unknown[0][:64],
            code="invalid_query",
        )
    out: dict[str, str] = {}
    for name, values in parsed.items():
        value = values[-1]
        if len(value) > MAX_TEXT:
            raise InvalidRequest(f"'{name}' is longer than {MAX_TEXT} characters", param=name)
        if value != "":
            out[name] = value
    return out


def _limit(values: dict[str, str], default: int) -> int:
    raw = values.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be a whole number from 1 to {MAX_LIMIT}", param="limit")
    return int(raw)


def _moment(raw: str, param: str) -> str:
    """An ISO 8601 time (a zone or none: UTC) in the ledger's form."""
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidRequest(
            f"'{param}' must be an ISO 8601 time, such as 2026-01-31T09:30:00Z", param=param
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    utc = moment.astimezone(UTC)
    return utc.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def call_filter(query_string: bytes) -> CallFilter:
    """``/ui/api/calls``'s filter: task, purpose, model, status, since, before, limit."""
    values = query_values(query_string, _CALL_PARAMS)
    status = values.get("status")
    if status is not None and status not in STATUSES:
        raise InvalidRequest("'status' must be 'ok', 'error' or 'abandoned'", param="status")
    since = values.get("since")
    before = None
    if "before" in values:
        started_at, _, call_id = values["before"].rpartition(",")
        if not started_at or not call_id:
            raise InvalidRequest(
                "'before' must be a page's 'next' value, as the last answer gave it",
                param="before",
            )
        before = (_moment(started_at, "before"), call_id)
    return CallFilter(
        task=values.get("task"),
        purpose=values.get("purpose"),
        model=values.get("model"),
        status=status,
        since=_moment(since, "since") if since is not None else None,
        before=before,
        limit=_limit(values, DEFAULT_LIMIT),
    )


def task_search(query_string: bytes) -> tuple[str | None, int]:
    """``/ui/api/tasks``'s search text and limit."""
    values = query_values(query_string, _TASK_PARAMS)
    return values.get("q"), _limit(values, DEFAULT_TASKS)


def page_cursor(cursor: tuple[str, str] | None) -> str | None:
    """The ``before`` value of the next page."""
    return f"{cursor[0]},{cursor[1]}" if cursor is not None else None
