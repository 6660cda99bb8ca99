"""The page's questions: query strings checked and turned into ledger filters, and the
SQL they become."""

from __future__ import annotations

import pytest

from boundedcode_gateway.errors import InvalidRequest
from boundedcode_gateway.llama_server.flags import shown_argv
from boundedcode_gateway.metering.ledger_queries import CallFilter, calls_query, tasks_query
from boundedcode_gateway.ui.queries import call_filter, page_cursor, task_search


def test_a_filter_from_every_parameter() -> None:
    f = call_filter(
        b"task=t1&purpose=agent_turn&model=local&status=error&since=2026-01-31T10:30:00%2B01:00"
        b"&limit=20&before=2026-01-31T09:00:00.123Z,call_abc"
    )
    assert f == CallFilter(
        task="t1",
        purpose="agent_turn",
        model="local",
        status="error",
        since="2026-01-31T09:30:00.000Z",
        before=("2026-01-31T09:00:00.123Z", "call_abc"),
        limit=20,
    )


def test_no_parameters_and_blank_ones_filter_nothing() -> None:
    assert call_filter(b"") == CallFilter()
    assert call_filter(b"task=&status=") == CallFilter()


def test_a_time_without_a_zone_is_utc() -> None:
    assert call_filter(b"since=2026-01-31T09:30").since == "2026-01-31T09:30:00.000Z"


@pytest.mark.parametrize(
    "query",
    [b"limit=0", b"limit=501", b"limit=-1", b"status=ok2", b"since=noon", b"before=x", b"x=1"],
)
def test_bad_values_are_refused(query: bytes) -> None:
    with pytest.raises(InvalidRequest):
        call_filter(query)


def test_a_value_too_long_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        call_filter(b"task=" + b"a" * 300)


def test_cursor_round_trip() -> None:
    cursor = ("2026-01-31T09:00:00.123Z", "call_abc")
    assert page_cursor(None) is None
    assert call_filter(b"before=" + page_cursor(cursor).encode()).before == cursor  # type: ignore[union-attr]


def test_task_search() -> None:
    assert task_search(b"") == (None, 200)
    assert task_search(b"q=abc&limit=5") == ("abc", 5)


def test_calls_sql_asks_one_row_more_than_the_page() -> None:
    sql, params = calls_query(CallFilter(task="t", status="ok", limit=10))
    assert sql.endswith(
        "WHERE task = ? AND status = ? ORDER BY started_at DESC, call_id DESC LIMIT ?"
    )
    assert params == ["t", "ok", 11]
    sql, params = calls_query(CallFilter(before=("2026", "call_b"), limit=1))
    assert "(started_at < ? OR (started_at = ? AND call_id < ?))" in sql
    assert params == ["2026", "2026", "call_b", 2]


def test_a_task_search_matches_its_text_literally() -> None:
    _, params = tasks_query("50%_off\\", 10)
    assert params == ["%50\\%\\_off\\\\%", 10]


def test_secret_flags_are_hidden() -> None:
    argv = ("llama-server", "--api-key", "s3cret", "--port", "8080", "--hf-token", "t", "--x")
    assert shown_argv(argv) == (
        "llama-server",
        "--api-key",
        "***",
        "--port",
        "8080",
        "--hf-token",
        "***",
        "--x",
    )


def test_every_spelling_of_a_secret_flag_is_hidden_and_a_path_is_shown() -> None:
    token, key = "hf_abcdefghijklmnopqrstuvwxyz012345", "sk-extra-0123456789"
    argv = (
        "llama-server",
        "-hf",
        "org/model-GGUF",
        "-hft",
        token,
        "--hf-token=" + token,
        "-HFT",
        token,
        "--api-key",
        key,
        "--api-key=" + key,
        "--api-key-file",
        "/etc/llama/key",
        "--ssl-key-file=/etc/llama/tls.key",
        "--my-secret",
        key,
        "--model-url",
        f"https://user:{key}@models.example/m.gguf",
        f"--mmproj-url=https://{token}@models.example/p.gguf",
        "--keep",
        "64",
    )
    shown = shown_argv(argv)
    assert shown == (
        "llama-server",
        "-hf",
        "org/model-GGUF",
        "-hft",
        "***",
        "--hf-token=***",
        "-HFT",
        "***",
        "--api-key",
        "***",
        "--api-key=***",
        "--api-key-file",
        "/etc/llama/key",
        "--ssl-key-file=/etc/llama/tls.key",
        "--my-secret",
        "***",
        "--model-url",
        "https://***@models.example/m.gguf",
        "--mmproj-url=https://***@models.example/p.gguf",
        "--keep",
        "64",
    )
    assert not any(token in a or key in a for a in shown)
