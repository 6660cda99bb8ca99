"""The ``report`` subcommand: rows, turns, filters, totals, the golden renderings and the charts.

The golden files are in tests/fixtures/report/, next to the call log they are made
from; ``BOUNDEDCODE_UPDATE_GOLDEN=1`` rewrites them (then read the diff).
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from boundedcode_gateway.cli.main import main
from boundedcode_gateway.metering.calllog import read_calls
from boundedcode_gateway.report.build import build_report
from boundedcode_gateway.report.plots import tick_labels, write_plots
from boundedcode_gateway.report.render import format_hit_ratio, render_markdown
from boundedcode_gateway.report.rows import number_turns, parse_since, select_rows
from boundedcode_gateway.report.totals import misses_by_cause, task_totals

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "report"
CALL_LOG = FIXTURES / "calls.jsonl"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


def check_golden(name: str, text: str) -> None:
    path = FIXTURES / name
    if os.environ.get("BOUNDEDCODE_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8")


def call(
    started: str, task: str = "t", purpose: str = "agent_turn", **fields: Any
) -> dict[str, Any]:
    return {"started_at": started, "task": task, "purpose": purpose, "status": "ok", **fields}


# -- golden output of the fixed call log


@pytest.mark.parametrize(
    ("args", "golden"),
    [
        ((), "expected.md"),
        (("--format", "csv"), "expected_calls.csv"),
        (("--format", "csv", "--table", "totals"), "expected_totals.csv"),
        (("--format", "json"), "expected.json"),
        (
            ("--task", "fix-parser", "--purpose", "agent_turn", "--since", "2026-03-01T10:00:11"),
            "expected_filtered.md",
        ),
    ],
)
def test_golden_output(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], golden: str
) -> None:
    code, out, err = run(capsys, "--data-dir", str(FIXTURES), *args)
    assert (code, err) == (0, "")
    check_golden(golden, out)


def test_config_names_the_data_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(CALL_LOG, data / "calls.jsonl")
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data_dir": str(data),
                "models": {"local": {"provider": "local", "external_url": "http://127.0.0.1:1"}},
            }
        )
    )
    code, out, _ = run(capsys, "--config", str(config))
    assert code == 0
    assert out == (FIXTURES / "expected.md").read_text(encoding="utf-8")


def test_config_and_data_dir_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["report", "--config", "x.yaml", "--data-dir", "d"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_an_empty_or_missing_log_has_no_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, "--data-dir", str(tmp_path))
    assert code == 0
    assert "(no calls)" in out
    code, out, _ = run(capsys, "--data-dir", str(tmp_path), "--format", "csv")
    assert out.count("\n") == 1  # the header only


# -- rows and turns


def test_turns_count_per_task_and_purpose_in_start_order() -> None:
    rows = number_turns(
        [
            call("2026-01-01T00:00:03.000Z", purpose="planner"),
            call("2026-01-01T00:00:01.000Z"),
            call("2026-01-01T00:00:02.000Z", task="u"),
            call("2026-01-01T00:00:04.000Z"),
            call("2026-01-01T00:00:05.000Z", purpose="planner"),
        ]
    )
    assert [(r.task, r.purpose, r.turn) for r in rows] == [
        ("t", "agent_turn", 1),
        ("u", "agent_turn", 1),
        ("t", "planner", 1),
        ("t", "agent_turn", 2),
        ("t", "planner", 2),
    ]


def test_a_filter_keeps_the_turn_numbers() -> None:
    rows = number_turns(read_calls(CALL_LOG, task="fix-parser"))
    kept = select_rows(rows, "agent_turn", parse_since("2026-03-01T10:00:11Z"))
    assert [r.turn for r in kept] == [3, 4, 5, 6, 7]


def test_fields_of_another_type_or_missing_read_as_not_reported() -> None:
    (row,) = number_turns([{"prompt_tokens": "12", "cached_tokens": True, "ttft_ms": 7}])
    assert (row.task, row.purpose, row.status) == ("default", "agent_turn", "error")
    assert row.prompt_tokens is None and row.cached_tokens is None
    assert row.ttft_ms == 7.0 and row.miss_cause is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-03-01", datetime(2026, 3, 1, tzinfo=UTC)),
        ("2026-03-01T10:00:11", datetime(2026, 3, 1, 10, 0, 11, tzinfo=UTC)),
        ("2026-03-01T10:00:11Z", datetime(2026, 3, 1, 10, 0, 11, tzinfo=UTC)),
        ("2026-03-01T12:00:11+02:00", datetime(2026, 3, 1, 10, 0, 11, tzinfo=UTC)),
    ],
)
def test_since_is_iso_and_utc_without_a_zone(text: str, expected: datetime) -> None:
    assert parse_since(text) == expected


def test_since_keeps_calls_from_that_moment_and_drops_unparsable_starts() -> None:
    rows = number_turns(
        [call("2026-01-01T00:00:01.000Z"), call("2026-01-01T00:00:02.000Z"), call("yesterday")]
    )
    assert [r.started_at for r in select_rows(rows, since=parse_since("2026-01-01T00:00:02Z"))] == [
        "2026-01-01T00:00:02.000Z"
    ]
    assert len(select_rows(rows)) == 3


def test_a_bad_since_is_one_line_and_no_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--data-dir", str(FIXTURES), "--since", "last week")
    assert (code, out) == (1, "")
    assert (
        err == "boundedcode-gateway report: --since 'last week' is not an ISO 8601 date or time\n"
    )


# -- totals


def test_cached_not_reported_is_not_zero() -> None:
    never = number_turns([call("2026-01-01T00:00:01Z", prompt_tokens=100, cached_tokens=None)])
    zero = number_turns([call("2026-01-01T00:00:01Z", prompt_tokens=100, cached_tokens=0)])
    t_never = task_totals("t", never, [])
    t_zero = task_totals("t", zero, [])
    assert (t_never.cached_tokens, t_never.hit_ratio) == (None, None)
    assert (t_zero.cached_tokens, t_zero.hit_ratio) == (0, 0.0)
    assert format_hit_ratio(t_never) == "not reported"
    assert format_hit_ratio(t_zero) == "0.0 %"


def test_hit_ratio_is_over_the_calls_that_reported_both() -> None:
    rows = number_turns(
        [
            call("2026-01-01T00:00:01Z", prompt_tokens=1000, cached_tokens=None),
            call("2026-01-01T00:00:02Z", prompt_tokens=400, cached_tokens=300),
            call("2026-01-01T00:00:03Z", status="error"),
        ]
    )
    totals = task_totals("t", rows, [])
    assert (totals.prompt_tokens, totals.cached_tokens, totals.hit_ratio) == (1400, 300, 0.75)
    assert format_hit_ratio(totals) == "75.0 % (1 of 2 calls)"


def test_misses_are_counted_as_logged_and_none_is_not_one() -> None:
    rows = number_turns(
        [
            call("2026-01-01T00:00:01Z", miss_cause="first_call"),
            call("2026-01-01T00:00:02Z", miss_cause="none"),
            call("2026-01-01T00:00:03Z", miss_cause="server"),
            call("2026-01-01T00:00:04Z", miss_cause="server"),
            call("2026-01-01T00:00:05Z", miss_cause="some_future_cause"),
            call("2026-01-01T00:00:06Z"),
        ]
    )
    assert misses_by_cause(rows) == {"server": 2, "first_call": 1, "some_future_cause": 1}


def test_repairs_are_apart_unless_asked_for() -> None:
    rows = number_turns(read_calls(CALL_LOG, task="fix-parser"))
    (report,) = build_report(rows)
    assert all(not r.is_repair for r in report.calls)
    assert (report.totals.repairs, report.totals.repair_evaluated_tokens) == (2, 152)
    # the turns' own, repairs (and the slot save) not included
    assert report.totals.evaluated_tokens == 7408
    assert [r.purpose for r in report.saves] == ["slot_save"]
    assert [r.restored_tokens for r in report.calls][-1] == 1515
    (repairs,) = build_report(select_rows(rows, "cache_repair"), "cache_repair")
    assert [(r.purpose, r.turn) for r in repairs.calls] == [
        ("cache_repair", 1),
        ("cache_repair", 2),
    ]
    assert repairs.totals.evaluated_tokens == 152 and repairs.totals.repairs == 0


def test_token_counts_are_no_turns_unless_asked_for() -> None:
    rows = number_turns(
        [
            call("2026-01-01T00:00:01Z", prompt_tokens=100, evaluated_tokens=100),
            call("2026-01-01T00:00:02Z", purpose="token_count", miss_cause="first_call"),
            call("2026-01-01T00:00:03Z", prompt_tokens=150, evaluated_tokens=50),
            call("2026-01-01T00:00:04Z", purpose="token_count", status="error"),
        ]
    )
    (report,) = build_report(rows)
    # a count is the gateway's own record of a request that called no model
    assert [r.purpose for r in report.calls] == ["agent_turn", "agent_turn"]
    assert [r.turn for r in report.token_counts] == [1, 2]
    totals = report.totals
    assert (totals.calls, totals.evaluated_tokens, totals.misses) == (2, 150, {})
    assert (totals.repairs, totals.repair_evaluated_tokens) == (0, None)
    markdown = render_markdown([report])
    assert "2 token counts (purpose `token_count`, no model call, not in the table)." in markdown
    assert "| token_count |" not in markdown
    (counts,) = build_report(select_rows(rows, "token_count"), "token_count")
    assert [(r.purpose, r.turn) for r in counts.calls] == [("token_count", 1), ("token_count", 2)]


def test_markdown_cells_escape_pipes() -> None:
    rows = number_turns([call("2026-01-01T00:00:01Z", miss_cause="a|b")])
    assert "a\\|b" in render_markdown(build_report(rows))


# -- charts


def png_size(data: bytes) -> tuple[int, int]:
    assert data.startswith(PNG_SIGNATURE)
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert data.endswith(b"IEND\xaeB`\x82")
    return width, height


def test_plots_are_valid_pngs_of_some_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from matplotlib.image import imread

    out_dir = tmp_path / "plots"
    code, out, err = run(capsys, "--data-dir", str(FIXTURES), "--plots", str(out_dir))
    assert code == 0
    assert out == (FIXTURES / "expected.md").read_text(encoding="utf-8")
    names = sorted(p.name for p in out_dir.iterdir())
    tasks = ("fix-parser", "review-docs", "summarise")
    assert names == sorted(
        f"{t}-{kind}.png" for t in tasks for kind in ("tokens", "ttft", "prefill")
    )
    assert err.count("wrote ") == len(names)
    for path in out_dir.iterdir():
        data = path.read_bytes()
        width, height = png_size(data)
        assert width >= 600 and height >= 400, path
        assert len(data) > 10_000, path
        pixels = imread(path)
        assert pixels.shape[:2] == (height, width)
        assert pixels.std() > 0.01, path  # not a blank canvas


def test_tokens_chart_of_many_turns_and_purposes(tmp_path: Path) -> None:
    calls = [
        call(
            f"2026-01-01T00:00:{i:02d}Z",
            purpose="planner" if i % 5 == 0 else "agent_turn",
            prompt_tokens=1000 + 100 * i,
            cached_tokens=900 + 100 * i if i % 7 else 0,
            evaluated_tokens=100 if i % 7 else 1000 + 100 * i,
            completion_tokens=50,
            ttft_ms=None if i == 3 else 100.0 + i,
            prefill_ms=10.0 * i,
            miss_cause="history_rewrite" if i % 7 == 0 else "none",
        )
        for i in range(30)
    ]
    reports = build_report(number_turns(calls))
    assert tick_labels(reports[0].calls)[:2] == ["planner 1", "agent_turn 1"]
    written = write_plots(reports, tmp_path / "new" / "dir")
    assert [p.name for p in written] == ["t-tokens.png", "t-ttft.png", "t-prefill.png"]
    assert all(png_size(p.read_bytes())[0] > 1000 for p in written)


def test_missing_matplotlib_is_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # None in sys.modules makes `import matplotlib` raise ImportError, as when not installed
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run(capsys, "--data-dir", str(FIXTURES), "--plots", str(tmp_path / "p"))
    assert (code, out) == (1, "")
    assert err == (
        "boundedcode-gateway report: --plots needs matplotlib, which is not installed: "
        "pip install 'boundedcode-gateway[report]'\n"
    )
    assert not (tmp_path / "p").exists()
