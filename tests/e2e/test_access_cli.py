"""The credential commands and the listening rule: `key new` prints a key and lines that
admit it, `token` mints a token the gateway takes, `chat` sends a key, and `serve` refuses
an address off the loopback interface without keys."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from boundedcode_gateway.access.tokens import verify_task_token
from boundedcode_gateway.app import GatewayApp
from boundedcode_gateway.cli import serve as serve_module
from boundedcode_gateway.cli.chat import KEY_ENV
from boundedcode_gateway.cli.main import main
from boundedcode_gateway.config import BudgetSettings
from tests.e2e.conftest import GatewayFactory, Upstreams

SERVE = [sys.executable, "-m", "boundedcode_gateway", "serve"]
HELLO: list[Any] = [{"role": "user", "content": "hello"}]
SECRET_ENV = "TEST_CLI_TOKEN_SECRET"
SECRET = "a-secret-for-the-token-command-0123456789"


def write_config(tmp_path: Path, upstreams: Upstreams, **settings: Any) -> Path:
    path = tmp_path / "gateway.yaml"
    config = {"data_dir": str(tmp_path / "data"), **settings, "models": upstreams.profiles}
    path.write_text(yaml.safe_dump(config))
    return path


def test_key_new_prints_a_key_and_the_lines_that_admit_it(
    upstreams: Upstreams, start_gateway: GatewayFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["key", "new", "--name", "ci", "--models", "local, other"]) == 0
    out = capsys.readouterr().out
    key, _, lines = out.partition("\n\n")
    assert key.startswith("bcg_") and key not in lines
    auth = yaml.safe_load(lines)["auth"]
    assert auth["keys"][0]["name"] == "ci" and auth["keys"][0]["models"] == ["local", "other"]
    gw = start_gateway(upstreams.profiles, auth=auth)
    reply = gw.client(api_key=key).chat.completions.create(model="local", messages=HELLO)
    assert reply.choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError):
        gw.client(api_key=key).chat.completions.create(model="gpt", messages=HELLO)
    assert gw.calls()[0]["caller"] == "ci"


def test_key_new_for_every_model_and_admin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["key", "new", "--name", "ops", "--admin"]) == 0
    entry = yaml.safe_load(capsys.readouterr().out.partition("\n\n")[2])["auth"]["keys"][0]
    assert entry["models"] == ["*"] and entry["admin"] is True


def test_key_new_refuses_a_bad_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["key", "new", "--name", "x" * 65]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--name" in captured.err


def test_token_mints_a_token_the_gateway_takes(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    auth = {"token_secret_env": SECRET_ENV}
    config = write_config(tmp_path, upstreams, auth=auth)
    argv = ["token", "--task", "t-9", "--models", "local", "--ttl", "2h", "--config", str(config)]
    assert main([*argv, "--budget-tokens", "5000"]) == 0
    captured = capsys.readouterr()
    minted = captured.out.strip()
    assert "task t-9" in captured.err and minted not in captured.err
    claims = verify_task_token(SECRET.encode(), minted, 0)
    assert claims.caller().budget == BudgetSettings(max_tokens=5000, per="lifetime")
    gw = start_gateway(upstreams.profiles, auth=auth)
    reply = gw.client(api_key=minted).chat.completions.create(model="local", messages=HELLO)
    assert reply.choices[0].message.content
    with pytest.raises(openai.PermissionDeniedError):
        gw.client(api_key=minted, task="t-10").chat.completions.create(
            model="local", messages=HELLO
        )
    assert gw.calls()[0]["task"] == "t-9"


@pytest.mark.parametrize(
    ("settings", "environ", "extra", "words"),
    [
        ({}, {}, [], "auth.token_secret_env is not set"),
        ({"auth": {"token_secret_env": SECRET_ENV}}, {}, [], f"{SECRET_ENV} is not set"),
        ({"auth": {"token_secret_env": SECRET_ENV}}, {SECRET_ENV: "short"}, [], "at least 32"),
        ({"auth": {"token_secret_env": SECRET_ENV}}, {SECRET_ENV: SECRET}, ["--ttl", "2w"], "2w"),
        (
            {"auth": {"token_secret_env": SECRET_ENV}},
            {SECRET_ENV: SECRET},
            ["--models", "local,claude"],
            "no such model: claude",
        ),
        (
            {"auth": {"token_secret_env": SECRET_ENV}},
            {SECRET_ENV: SECRET},
            ["--task", "../etc"],
            "not a task id",
        ),
    ],
)
def test_token_fails_clearly(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    settings: dict[str, Any],
    environ: dict[str, str],
    extra: list[str],
    words: str,
) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    config = write_config(tmp_path, upstreams, **settings)
    argv = ["token", "--task", "t-9", "--models", "local", "--ttl", "2h", "--config", str(config)]
    assert main([*argv, *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and words in captured.err


def test_chat_sends_the_key_from_the_environment(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["key", "new", "--name", "me", "--models", "local"]) == 0
    key, _, lines = capsys.readouterr().out.partition("\n\n")
    gw = start_gateway(upstreams.profiles, auth=yaml.safe_load(lines)["auth"])
    argv = ["chat", "--url", gw.url, "--model", "local", "--message", "hi"]
    with pytest.raises(SystemExit, match="No API key given"):
        main(argv)
    monkeypatch.setenv(KEY_ENV, key)
    assert main(argv) == 0
    assert [c["caller"] for c in gw.calls()] == ["me"]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[serve_module._GatewayServer]:
    servers: list[serve_module._GatewayServer] = []

    def unbound_socket(host: str, port: int) -> socket.socket:
        # the addresses under test (192.0.2.7, the default port) need not be this machine's
        return socket.socket()

    def run(self: serve_module._GatewayServer, sockets: list[socket.socket]) -> None:
        assert len(sockets) == 1
        servers.append(self)
        self.started = True

    monkeypatch.setattr(serve_module, "listening_socket", unbound_socket)
    monkeypatch.setattr(serve_module._GatewayServer, "run", run)
    return servers


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_serve_refuses_an_open_address_without_keys(
    upstreams: Upstreams,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    started: list[serve_module._GatewayServer],
    host: str,
) -> None:
    config = write_config(tmp_path, upstreams)
    assert main(["serve", "--config", str(config), "--host", host]) == 2
    err = capsys.readouterr().err
    assert f"refusing to listen on {host}" in err
    assert "boundedcode-gateway key new" in err and "--insecure-no-auth" in err
    assert started == []


def test_serve_listens_off_loopback_with_keys_or_when_told_to(
    upstreams: Upstreams,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    started: list[serve_module._GatewayServer],
) -> None:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    open_config = write_config(tmp_path, upstreams)
    assert (
        main(["serve", "--config", str(open_config), "--host", "0.0.0.0", "--insecure-no-auth"])
        == 0
    )
    keyed = write_config(tmp_path, upstreams, auth={"token_secret_env": SECRET_ENV})
    assert main(["serve", "--config", str(keyed), "--host", "192.0.2.7", "--port", "9"]) == 0
    assert main(["serve", "--config", str(open_config)]) == 0  # loopback by default
    assert [(s.config.host, s.config.port) for s in started] == [
        ("0.0.0.0", 8780),
        ("192.0.2.7", 9),
        ("127.0.0.1", 8780),
    ]
    # the app was told where it listens: its own address is a Host it answers
    app = started[1].config.app
    assert isinstance(app, GatewayApp)
    app.service.live.sites.check("192.0.2.7:9", None)


def test_serve_refusal_is_the_process_exit_code(tmp_path: Path) -> None:
    # a gateway that could not start anyway: should the check let it through, serve stops
    # on the missing llama-server before it binds anything
    config = tmp_path / "gateway.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "data_dir": str(tmp_path / "data"),
                "llama_server_bin": str(tmp_path / "no-llama-server"),
                "models": {"local": {"provider": "local", "model_path": str(tmp_path / "m.gguf")}},
            }
        )
    )
    done = subprocess.run(
        [*SERVE, "--config", str(config), "--host", "0.0.0.0"], capture_output=True, timeout=60
    )
    assert done.returncode == 2
    assert b"boundedcode-gateway key new" in done.stderr
