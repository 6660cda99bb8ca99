"""Strings a caller chose: clipped where kept, their control characters escaped where shown
(the ``calls`` table, the report in Markdown and CSV)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.cli.calls import format_calls_table, run_calls
from boundedcode_gateway.metering.calllog import append_lines
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.report.build import build_report
from boundedcode_gateway.report.render import render_csv_calls, render_markdown
from boundedcode_gateway.report.rows import number_turns
from boundedcode_gateway.text import MAX_NAME_CHARS, clip, printable

HOSTILE = "\x1b]0;owned\x07\x1b[2J\r\x00evil\u202etxt.exe\x9b31m\u2028\x7f"


# what reorders or breaks what a terminal shows, besides the Cc controls
REORDERING = frozenset("\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def acts_on_a_terminal(text: str) -> list[str]:
    """The characters of ``text`` that a terminal would act on, the table's newlines aside."""
    return [c for c in text if c != "\n" and (unicodedata.category(c) == "Cc" or c in REORDERING)]


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    shown = printable(HOSTILE)
    assert acts_on_a_terminal(shown) == []
    assert shown.startswith("\\x1b]0;owned\\x07\\x1b[2J\\x0d\\x00evil")
    assert "\\u202e" in shown and "\\x9b" in shown and "\\x7f" in shown
    assert printable("naïve 名前 🙂 tab-free") == "naïve 名前 🙂 tab-free"


@given(st.text())
def test_printable_leaves_nothing_a_terminal_acts_on(text: str) -> None:
    assert acts_on_a_terminal(printable(text).replace("\n", "\\n")) == []


def test_clip_bounds_what_is_kept() -> None:
    assert clip("local") == "local"
    long = "m" * 10_000
    assert clip(long) == "m" * MAX_NAME_CHARS + "…"
    assert clip("x" * MAX_NAME_CHARS) == "x" * MAX_NAME_CHARS


def _record(task: str, model: str) -> CallRecord:
    return CallRecord(
        call_id="call_1",
        started_at="2026-01-01T00:00:00.000Z",
        task=task,
        purpose="agent_turn",
        model_profile=model,
        status="error",
        http_status=404,
        error_code="model_not_found",
    )


def test_the_calls_table_escapes_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = _record(HOSTILE, HOSTILE).to_dict()
    assert acts_on_a_terminal(format_calls_table([row])) == []
    calls = tmp_path / "calls.jsonl"
    append_lines(calls, [_record(HOSTILE, HOSTILE)])
    assert run_calls(tmp_path / "no-ledger.db", calls, task=None, last=5) == 0
    out = capsys.readouterr().out
    assert "\\x1b]0;owned" in out
    assert acts_on_a_terminal(out) == []


def test_the_report_escapes_control_characters() -> None:
    reports = build_report(number_turns([_record(HOSTILE, "m").to_dict()]))
    markdown = render_markdown(reports)
    assert "## Task `\\x1b]0;owned" in markdown
    assert acts_on_a_terminal(markdown) == []
    csv_text = render_csv_calls(reports)
    assert "\\x1b]0;owned" in csv_text
    assert acts_on_a_terminal(csv_text) == []
