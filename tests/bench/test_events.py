"""The events benchmark's pure parts: the plan of each run, the side requests, the context
check, a streamed answer put back together, the call log joined to the calls, the
gateway's configuration, and the report and charts from golden rows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from bench.inference import events_plots, events_results
from bench.inference.events import (
    EVENTS,
    SUMMARY_SYSTEM,
    TITLE_SYSTEM,
    check_fits,
    parse_events,
    parse_modes,
    plan,
    side_messages,
)
from bench.inference.events_run import EventSettings, gateway_config, join_call_log
from bench.inference.streamed import StreamedAnswer, StreamError
from bench.inference.workload import load_workload

from bench import real_server
from boundedcode_gateway.config import load_config


def test_a_restart_comes_before_the_last_turn_which_is_the_one_after_it() -> None:
    calls = plan(EVENTS["restart"])
    assert [(c.seq, c.task, c.kind, c.turn) for c in calls] == [
        (1, 1, "agent", 1),
        (2, 1, "agent", 2),
        (3, 1, "agent", 3),
        (4, 1, "agent", 4),
    ]
    assert [c.event_before for c in calls] == [False, False, False, True]
    assert [c.after_event for c in calls] == [False, False, False, True]
    two = plan(EVENTS["failover"].with_turns(2))
    assert [(c.turn, c.event_before, c.after_event) for c in two] == [
        (1, False, False),
        (2, True, True),
    ]
    with pytest.raises(ValueError):
        EVENTS["restart"].with_turns(1)


def test_crowded_tasks_take_turns_and_every_turn_after_the_first_round_counts() -> None:
    calls = plan(EVENTS["crowded"])
    assert [(c.task, c.turn, c.after_event) for c in calls] == [
        (1, 1, False),
        (2, 1, False),
        (3, 1, False),
        (1, 2, True),
        (2, 2, True),
        (3, 2, True),
    ]
    assert not any(c.event_before for c in calls)
    assert EVENTS["crowded"].cache_ram_mib == 0 and EVENTS["crowded-ram"].cache_ram_mib > 0


def test_side_requests_come_between_the_agent_turns() -> None:
    calls = plan(EVENTS["side-requests"])
    assert [(c.kind, c.turn, c.after_event) for c in calls] == [
        ("agent", 1, False),
        ("title", 1, False),
        ("summary", 1, False),
        ("agent", 2, True),
        ("title", 2, False),
        ("summary", 2, False),
        ("agent", 3, True),
    ]


def test_events_and_modes_are_named_or_all() -> None:
    assert [e.name for e in parse_events("all")] == list(EVENTS)
    assert [e.name for e in parse_events("restart,failover")] == ["restart", "failover"]
    assert parse_modes("slot-files,litellm") == ["slot-files", "litellm"]
    for bad in ("restart,nope", ""):
        with pytest.raises(ValueError):
            parse_events(bad)
    with pytest.raises(ValueError):
        parse_modes("gateway-auto")


HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are an agent."},
    {"role": "user", "content": "Fix the failing test."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "src/ tests/ " + "x" * 2000},
    {"role": "assistant", "content": "I will read src/app.py."},
]


def test_a_title_quotes_the_last_input_and_a_summary_the_conversation() -> None:
    title = side_messages("title", HISTORY)
    assert title[0] == {"role": "system", "content": TITLE_SYSTEM}
    assert title[1]["content"].startswith("src/ tests/ ") and len(title[1]["content"]) == 1000
    summary = side_messages("summary", HISTORY)
    assert summary[0] == {"role": "system", "content": SUMMARY_SYSTEM}
    lines = summary[1]["content"].splitlines()
    assert lines[0] == "User: Fix the failing test."
    assert lines[1] == "Assistant: ls({})"
    assert lines[2] == "Tool: src/ tests/ " + "x" * 288  # each message cut to 300 characters
    assert lines[3] == "Assistant: I will read src/app.py."
    with pytest.raises(ValueError):
        side_messages("agent", HISTORY)


def test_the_events_fit_a_slot_with_reasoning_answers_and_more_turns_do_not() -> None:
    workload = load_workload("tool-loop")
    for event in EVENTS.values():
        assert check_fits(workload, event.turns, 300, 8192) <= 8192
    with pytest.raises(ValueError, match="over a slot's 8192"):
        check_fits(workload, 12, 300, 8192)


def _data(chunk: dict[str, Any]) -> str:
    return "data: " + orjson.dumps(chunk).decode()


def test_a_streamed_answer_is_put_back_together_and_its_first_token_timed() -> None:
    answer = StreamedAnswer()
    lines = [
        _data({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
        "",
        ": keep-alive",
        _data({"choices": [{"index": 0, "delta": {"reasoning_content": "Let me "}}]}),
        _data({"choices": [{"index": 0, "delta": {"reasoning_content": "look."}}]}),
        _data({"choices": [{"index": 0, "delta": {"content": "Reading."}}]}),
        _data(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "c1",
                                    "function": {"name": "read_", "arguments": ""},
                                }
                            ]
                        },
                    }
                ]
            }
        ),
        _data(
            {
                "choices": [
                    {
                        "index": 0,
                        "delta": {
                            "tool_calls": [
                                {"index": 0, "function": {"name": "file", "arguments": '{"p":1}'}}
                            ]
                        },
                        "finish_reason": "tool_calls",
                    }
                ]
            }
        ),
        _data({"choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": 12}}),
        "data: [DONE]",
    ]
    for ms, line in enumerate(lines):
        answer.feed(line, float(ms * 10))
    assert answer.first_token_ms == 30.0  # the role-only chunk is no token
    assert answer.done and answer.finish_reason == "tool_calls"
    assert answer.usage == {"prompt_tokens": 900, "completion_tokens": 12}
    assert answer.message() == {
        "role": "assistant",
        "content": "Reading.",
        "reasoning_content": "Let me look.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"p":1}'},
            }
        ],
    }
    with pytest.raises(StreamError):
        answer.feed(_data({"error": {"message": "upstream broke"}}), 99.0)
    assert StreamedAnswer().message() == {"role": "assistant", "content": None}


SETTINGS = EventSettings(
    model=real_server.DEFAULT_MODEL,
    template=Path("bench/inference/qwen3_tools.jinja"),
    reasoning_budget=250,
    max_tokens=300,
    temperature=0.8,
    seed=7,
    threads=2,
    ctx_size=8192,
    idle_save_s=1.0,
    tool_time_s=2.0,
    call_timeout_s=600.0,
    run_timeout_s=900.0,
)


def test_the_gateway_runs_its_servers_with_or_without_slot_files(tmp_path: Path) -> None:
    on = load_config(gateway_config(tmp_path, EVENTS["crowded"], "slot-files", SETTINGS))
    assert on.prompt_cache.slot_files and on.prompt_cache.idle_save_s == 1.0
    local = on.models["local"]
    assert local.replicas is None and local.reasoning_history == "auto"
    server = local.server
    assert server is not None
    assert (server.parallel, server.ctx_size, server.cache_ram_mib, server.threads) == (
        1,
        8192,
        0,
        2,
    )
    assert server.extra_args == ("--reasoning-budget", "250", "--metrics")
    off = load_config(gateway_config(tmp_path, EVENTS["failover"], "no-slot-files", SETTINGS))
    assert not off.prompt_cache.slot_files
    assert off.models["local"].replicas == 2 and off.models["local"].routing == "affinity"


def test_litellm_tries_the_second_deployment_once_the_first_is_down() -> None:
    one = real_server.litellm_config("http://a")
    assert [d["litellm_params"]["api_base"] for d in one["model_list"]] == ["http://a/v1"]
    assert "order" not in one["model_list"][0]["litellm_params"] and "router_settings" not in one
    two = real_server.litellm_config("http://a", ["http://b"])
    params = [d["litellm_params"] for d in two["model_list"]]
    assert [(p["api_base"], p["order"]) for p in params] == [("http://a/v1", 1), ("http://b/v1", 2)]
    assert {d["model_name"] for d in two["model_list"]} == {real_server.LITELLM_MODEL}
    assert two["router_settings"]["num_retries"] >= 1


def test_the_call_log_is_joined_to_the_calls_per_task_in_order() -> None:
    rows: list[dict[str, Any]] = [
        {"task": "t-1", "seq": 1},
        {"task": "t-2", "seq": 2},
        {"task": "t-1", "seq": 3},
    ]
    records: list[dict[str, Any]] = [
        {"task": "t-1", "purpose": "agent_turn", "started_at": "2026-01-01T00:00:05.000Z"},
        {"task": "t-1", "purpose": "slot_save", "started_at": "2026-01-01T00:00:04.000Z"},
        {"task": "t-1", "purpose": "cache_repair", "started_at": "2026-01-01T00:00:02.000Z"},
        {"task": "t-1", "purpose": "agent_turn", "started_at": "2026-01-01T00:00:01.000Z"},
        {"task": "t-2", "purpose": "agent_turn", "started_at": "2026-01-01T00:00:03.000Z"},
    ]
    for n, record in enumerate(records):
        record.update(evaluated_tokens=10 * (n + 1), restored_tokens=n or None, ttft_ms=5.0)
    join_call_log(rows, records)
    assert [(r["seq"], r["evaluated_tokens"], r["repair_evaluated"]) for r in rows] == [
        (1, 40, 30),
        (2, 50, 0),
        (3, 10, 0),
    ]
    assert rows[0]["gateway_ttft_ms"] == 5.0 and rows[0]["restored_tokens"] == 3
    with pytest.raises(RuntimeError, match="2 calls sent, 1 in the call log"):
        join_call_log(rows, records[1:])


def row(mode: str, seq: int, evaluated: int, ttft: float, **extra: Any) -> dict[str, Any]:
    return {
        "event": "restart",
        "mode": mode,
        "kind": "agent",
        "seq": seq,
        "task": "bench-tool-loop-1",
        "task_n": 1,
        "turn": seq,
        "event_before": seq == 3,
        "after_event": seq == 3,
        "evaluated_tokens": evaluated,
        "repair_evaluated": 0,
        "ttft_ms": ttft,
        "completion_tokens": 200 + seq,
        **extra,
    }


ROWS = [
    row("slot-files", 1, 2100, 9000.0, repair_evaluated=6, miss_cause="first_call"),
    row("slot-files", 2, 300, 2000.0, repair_evaluated=6, miss_cause="none"),
    row("slot-files", 3, 250, 1500.0, restored_tokens=2700, miss_cause="none"),
    row("no-slot-files", 1, 2100, 9100.0, repair_evaluated=6, miss_cause="first_call"),
    row("no-slot-files", 2, 300, 2100.0, repair_evaluated=6, miss_cause="none"),
    row("no-slot-files", 3, 3000, 15000.0, miss_cause="server"),
    row("litellm", 1, 2100, 9050.0),
    row("litellm", 2, 500, 3000.0),
    row("litellm", 3, 2500, 12000.0),
    {"event": "crowded", "mode": "litellm", "kind": "error", "error": "RuntimeError('boom')"},
]


def test_each_mode_is_summed_and_the_calls_after_the_event_apart() -> None:
    summaries = events_results.by_event(ROWS)
    assert list(summaries) == ["restart", "crowded"]
    restart = summaries["restart"]
    assert list(restart) == ["slot-files", "no-slot-files", "litellm"]
    mine = restart["slot-files"]
    assert (mine.calls, mine.after_calls, mine.after_evaluated, mine.after_ttft_ms) == (
        3,
        1,
        250,
        1500.0,
    )
    assert (mine.evaluated, mine.repair, mine.total, mine.restored) == (2650, 12, 2662, 2700)
    assert summaries["crowded"]["litellm"].error == "RuntimeError('boom')"


def test_the_report_has_a_table_and_the_ratios_per_event() -> None:
    text = events_results.report(ROWS, "# run", charts=True)
    lines = text.splitlines()
    assert (
        "| restart | 250 / 3,000 / 2,500 | 1,500 / 15,000 / 12,000 | 0.08, 0.10 | 0.10, 0.12 |"
        in (lines)
    )
    assert "| slot-files | 3 | 1 | 250 | 1,500 | 2,700 | 2,662 (2,650 + 12) | 202 |" in lines
    assert "| no-slot-files | 3 | 1 | 3,000 | 15,000 | 0 | 5,412 (5,400 + 12) | 202 |" in lines
    assert "| litellm | 3 | 1 | 2,500 | 12,000 | 0 | 5,100 (5,100 + 0) | 202 |" in lines
    assert "| slot-files / no-slot-files | 0.08 | 0.10 | 0.49 |" in lines
    assert "| slot-files / litellm | 0.10 | 0.12 | 0.52 |" in lines
    assert (
        "| 3 (after the event) | 1 | agent | 3 | 250 · 1,500 ms · restored 2,700 | "
        "3,000 · 15,000 ms · server | 2,500 · 12,000 ms |"
    ) in lines
    assert "| 1 | 1 | agent | 1 | 2,100 · 9,000 ms · first_call |" in text
    assert "![restart: evaluated and TTFT per call](events-restart.png)" in lines
    assert "| litellm | failed: RuntimeError('boom') | | | | | | |" in lines
    assert "| crowded | - / - / - | - / - / - | - | - |" in lines


def test_a_chart_per_event_with_calls(tmp_path: Path) -> None:
    written = events_plots.write_plots(ROWS, tmp_path)
    assert [p.name for p in written] == ["events-restart.png"]  # the failed run has none
    png = written[0].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
