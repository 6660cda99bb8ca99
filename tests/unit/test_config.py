"""Configuration: valid files load; every kind of mistake names the key and its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from boundedcode_gateway.cli.main import CONFIG_ENV, config_source, main
from boundedcode_gateway.config import ConfigSource, load_config, parse_config
from boundedcode_gateway.errors import ConfigError, InvalidApiKeyConfig

GOOD = """\
data_dir: .gateway
ledger: sqlite:///.gateway/ledger.db
inference:
  reasoning_history: auto
models:
  local:
    provider: local
    external_url: http://127.0.0.1:8080
  gpt:
    provider: openai
    model: gpt-5.1
    api_key_env: OPENAI_API_KEY
    base_url: https://api.openai.com/v1
"""


def test_the_documented_shape_loads() -> None:
    config = parse_config(GOOD)
    assert config.ledger_path == Path(".gateway/ledger.db")
    assert config.calls_path == Path(".gateway/calls.jsonl")
    assert config.models["gpt"].upstream_base_url == "https://api.openai.com/v1"
    assert config.models["local"].upstream_base_url == "http://127.0.0.1:8080/v1"
    assert config.max_body_bytes == 32 * 1024 * 1024
    assert config.reasoning_history_for(config.models["gpt"]) == "auto"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("reasoning_history: auto", "reasoning_history: auto\n  colour: red"),
            "<c>:5: inference.colour: unknown key",
        ),
        (("provider: openai", "provider: opena"), "<c>:10: models.gpt.provider: Input should be"),
        (
            ("    external_url: http://127.0.0.1:8080\n", ""),
            "<c>:6: models.local: provider 'local' needs exactly one of 'external_url'",
        ),
        (("data_dir: .gateway", "data_dir: 3"), "<c>:1: data_dir: Input should be a valid string"),
        (
            ("api_key_env: OPENAI_API_KEY", "api_key_env: 5"),
            "<c>:12: models.gpt.api_key_env: Input should be a valid string",
        ),
        (
            ("    api_key_env: OPENAI_API_KEY\n", ""),
            "<c>:9: models.gpt: missing required key 'api_key_env'",
        ),
        (
            ("reasoning_history: auto", "reasoning_history: sometimes"),
            "<c>:4: inference.reasoning_history: Input should be 'auto', 'keep' or 'drop'",
        ),
    ],
)
def test_mistakes_name_key_and_line(change: tuple[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD.replace(*change), "<c>")
    assert str(info.value).startswith(expected)


def test_missing_models_is_named() -> None:
    with pytest.raises(ConfigError, match="models: missing required key"):
        parse_config("data_dir: x\n", "<c>")


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "absent.yaml")


def test_bad_config_exits_2_with_one_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(GOOD.replace("provider: local", "provider: local\n    colour: red"))
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "models.local.colour: unknown key" in err[0]
    assert f"{path}:8" in err[0]


def test_every_provider_kind_has_an_adapter() -> None:
    from typing import get_args

    from boundedcode_gateway.provider_kinds import ProviderKind
    from boundedcode_gateway.providers.registry import FACTORIES

    assert set(FACTORIES) == set(get_args(ProviderKind))


def test_the_source_is_chosen_once_and_read_again_each_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    embedded = config_source(None)
    assert embedded == ConfigSource() and "local" in embedded.load().models
    (tmp_path / "gateway.yaml").write_text(GOOD)
    assert config_source(None) == ConfigSource(Path("gateway.yaml"))
    assert embedded.load().models["local"].model_path is not None  # still the embedded one
    named = tmp_path / "named.yaml"
    monkeypatch.setenv(CONFIG_ENV, str(named))
    source = config_source(None)
    assert source == ConfigSource(named) and config_source("x.yaml") == ConfigSource(Path("x.yaml"))
    named.write_text("max_body_mib: 1\n" + GOOD)
    first = source.load()
    named.write_text("max_body_mib: 2\n" + GOOD)
    assert (first.max_body_mib, source.load().max_body_mib) == (1, 2)


@pytest.mark.parametrize(
    "value",
    ["sk-proj-abcdef0123456789", "0PENAI_KEY", "MY KEY", "KEY=sk-abc", "AIzaSy-Dk3/xyz"],
)
def test_api_key_env_holding_a_key_is_refused_without_repeating_it(
    value: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = GOOD.replace("api_key_env: OPENAI_API_KEY", f"api_key_env: '{value}'")
    with pytest.raises(ConfigError) as info:
        parse_config(text, "<c>")
    message = str(info.value)
    assert message.startswith("<c>:12: models.gpt.api_key_env: must name an environment variable")
    assert value not in message
    # nor does `check-config` print it
    path = tmp_path / "g.yaml"
    path.write_text(text)
    assert main(["check-config", "--config", str(path)]) == 2
    out = capsys.readouterr()
    assert "api_key_env" in out.err and value not in out.err + out.out


@pytest.mark.parametrize("name", ["OPENAI_API_KEY", "_KEY", "key2", "A"])
def test_api_key_env_names_a_variable(name: str) -> None:
    text = GOOD.replace("api_key_env: OPENAI_API_KEY", f"api_key_env: {name}")
    assert parse_config(text).models["gpt"].api_key_env == name


def test_upstream_limits_and_call_limits_load_with_their_defaults() -> None:
    inference = parse_config(GOOD).inference
    assert inference.max_call_s == 3600 and inference.write_stall_s == 60
    limits = inference.upstream_limits
    assert (limits.max_body_mib, limits.max_inflated_mib, limits.max_event_mib) == (64, 64, 8)
    assert (limits.max_stream_mib, limits.max_captured_mib) == (256, 32)
    assert (limits.max_header_kib, limits.header_timeout_s) == (64, 10)
    text = GOOD.replace(
        "reasoning_history: auto",
        "reasoning_history: auto\n  max_call_s: 900\n  write_stall_s: 5\n"
        "  upstream_limits: {max_body_mib: 8, header_timeout_s: 2.5}",
    )
    inference = parse_config(text).inference
    assert inference.max_call_s == 900 and inference.write_stall_s == 5
    assert inference.upstream_limits.max_body_mib == 8
    assert inference.upstream_limits.header_timeout_s == 2.5
    with pytest.raises(ConfigError, match=r"inference\.upstream_limits\.max_event_mib"):
        parse_config(text.replace("max_body_mib: 8", "max_event_mib: 0"), "<c>")
    # a gateway whose calls may run as long as they like says so
    assert (
        parse_config(text.replace("max_call_s: 900", "max_call_s: null")).inference.max_call_s
        is None
    )


@pytest.mark.parametrize(
    "key", ["sk-a\r\nX-Injected: 1", "sk-a\n", "\tsk-a", "sk-\x7fa", "sk-caf\u00e9"]
)
def test_a_key_no_header_can_carry_is_refused_naming_the_variable(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    profile = parse_config(GOOD).models["gpt"]
    with pytest.raises(InvalidApiKeyConfig) as info:
        profile.api_key()
    assert "OPENAI_API_KEY" in info.value.message and "sk-" not in info.value.message
    assert info.value.http_status == 500 and info.value.code == "invalid_api_key_config"
    # still redacted wherever it might show
    assert profile.secrets() == (key,)


@pytest.mark.parametrize("key", ["sk-proj-Ab_09.x~", "Bearer-like token with spaces"])
def test_a_key_a_header_can_carry_is_used(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", key)
    assert parse_config(GOOD).models["gpt"].api_key() == key


def test_reasoning_sharing_and_the_seals_age_default_and_are_checked() -> None:
    settings = parse_config(GOOD).reasoning
    assert (settings.shared_by, settings.seal_max_age_days) == ("caller", 30)
    assert settings.seal_max_age_s == 30 * 86400
    shared = parse_config(GOOD + "reasoning: {shared_by: task, seal_max_age_days: 1.5}\n")
    assert shared.reasoning.shared_by == "task" and shared.reasoning.seal_max_age_s == 129600
    with pytest.raises(ConfigError, match=r"reasoning\.shared_by"):
        parse_config(GOOD + "reasoning: {shared_by: everyone}\n", "<c>")
    with pytest.raises(ConfigError, match=r"reasoning\.seal_max_age_days"):
        parse_config(GOOD + "reasoning: {seal_max_age_days: 0}\n", "<c>")


def test_remote_media_is_refused_for_a_local_profile_unless_it_says_pass() -> None:
    config = parse_config(GOOD)
    assert config.models["local"].remote_media is None
    assert config.models["local"].takes_media_urls is False
    # a cloud provider fetches from its own network: left as it is
    assert config.models["gpt"].takes_media_urls is True
    local = "    external_url: http://127.0.0.1:8080\n"
    passing = parse_config(GOOD.replace(local, local + "    remote_media: pass\n"))
    assert passing.models["local"].takes_media_urls is True
    refusing = parse_config(GOOD.replace(local, local + "    remote_media: refuse\n"))
    assert refusing.models["local"].takes_media_urls is False


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            (
                "    external_url: http://127.0.0.1:8080\n",
                "    external_url: http://127.0.0.1:8080\n    remote_media: fetch\n",
            ),
            "<c>:9: models.local.remote_media: Input should be 'refuse' or 'pass'",
        ),
        (
            (
                "    api_key_env: OPENAI_API_KEY\n",
                "    api_key_env: OPENAI_API_KEY\n    remote_media: refuse\n",
            ),
            "<c>:9: models.gpt: 'remote_media' is only for provider 'local', not 'openai'",
        ),
    ],
)
def test_remote_media_mistakes_name_key_and_line(change: tuple[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(GOOD.replace(*change), "<c>")
    assert str(info.value).startswith(expected)
