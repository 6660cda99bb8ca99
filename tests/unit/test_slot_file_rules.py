"""The rules around slot files that need no server: whether a restore worked, which
flags a managed server whose slots are saved runs with, its share of the host-memory
prompt cache, and which flags make a slot file fit only servers run alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from boundedcode_gateway.config import ServerSettings, parse_config
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.llama_server.flags import kv_layout_args, server_command, slots_of
from boundedcode_gateway.llama_server.servers import cache_ram_share
from boundedcode_gateway.llama_server.slot_files import RestoreOutcome


@pytest.mark.parametrize(
    ("cached", "diverged", "verdict"),
    [
        (1000, False, "effective"),
        # the last prompt token is always evaluated again, and the template's tail
        (1000 - 8 - 20, False, "effective"),
        (1000 - 8 - 21, False, "reevaluated"),
        (0, False, "reevaluated"),
        (0, True, "prefix_diverged"),
    ],
)
def test_a_restore_worked_when_the_call_found_what_was_restored(
    cached: int, diverged: bool, verdict: str
) -> None:
    outcome = RestoreOutcome(tokens=1200, expected=1000)
    outcome.judge(1000, cached, diverged, tolerance=8)
    assert outcome.verdict == verdict
    assert outcome.failure == (None if verdict == "effective" else verdict)


def test_a_refused_file_is_named_in_the_failure() -> None:
    outcome = RestoreOutcome(refused="cut")
    outcome.judge(500, 0, False, tolerance=8)
    assert outcome.failure == "file_refused: cut"
    nothing = RestoreOutcome(save_ms=3.0)  # a save alone: nothing to judge
    nothing.judge(500, 0, False, tolerance=8)
    assert nothing.verdict is None and nothing.failure is None


def test_a_managed_server_whose_slots_are_saved_runs_with_a_fixed_count_and_folder(
    tmp_path: Path,
) -> None:
    slots = tmp_path / "s.slots"
    argv = server_command(
        "llama-server", "m.gguf", 1, "m", ServerSettings(), slots, isolated=False, cache_ram_mib=512
    ).argv
    assert argv[-7:] == (
        "--parallel",
        "4",
        "--kv-unified",
        "--cache-ram",
        "512",
        "--slot-save-path",
        str(slots),
    )
    own = server_command(
        "llama-server",
        "m.gguf",
        1,
        "m",
        ServerSettings(cache_ram_mib=64, extra_args=("-np", "2")),
        slots,
        isolated=False,
        cache_ram_mib=512,
    ).argv
    # the operator's own slot count and cache size stand
    assert "--kv-unified" not in own and own.count("--cache-ram") == 1
    assert own[own.index("--cache-ram") + 1] == "64"
    assert slots_of(ServerSettings(extra_args=("-np", "2"))) == 2
    assert slots_of(ServerSettings(extra_args=("--parallel=3",))) == 3


def test_the_host_memory_cache_budget_is_shared_by_the_managed_servers() -> None:
    text = """
prompt_cache: {ram_mib: 3000}
models:
  a: {provider: local, model_path: a.gguf, replicas: 2}
  b: {provider: local, model_path: b.gguf}
  c: {provider: local, external_url: "http://127.0.0.1:1"}
"""
    assert cache_ram_share(parse_config(text)) == 1000
    off = "prompt_cache: {ram_mib: null}\nmodels: {a: {provider: local, model_path: a.gguf}}\n"
    assert cache_ram_share(parse_config(off)) is None


def test_the_flags_that_change_a_slots_saved_state_are_part_of_its_identity() -> None:
    argv = ("--ctx-size", "4096", "--threads", "2", "-ctk", "q8_0", "--flash-attn=on", "--metrics")
    assert kv_layout_args(argv) == ("--ctx-size", "4096", "-ctk", "q8_0", "--flash-attn=on")


def test_slot_save_path_is_for_a_server_the_gateway_does_not_run() -> None:
    with pytest.raises(ConfigError, match="slot_save_path"):
        parse_config(
            "models: {a: {provider: local, model_path: a.gguf, server: {slot_save_path: /x}}}\n"
        )
    config = parse_config(
        "models: {a: {provider: local, external_url: 'http://127.0.0.1:1', "
        "server: {slot_save_path: /x}}}\n"
    )
    assert config.models["a"].server is not None
