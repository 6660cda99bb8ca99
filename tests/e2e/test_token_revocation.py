"""Revoking credentials with a reload, on a running ``serve``: a new secret in the token
secret's file refuses every token of the old one at once (a previous secret on its
second line keeps them for one rotation), a token living longer than the maximum in
force is refused, and an open page event stream ends when its key is taken away."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from boundedcode_gateway.access.keys import key_digest, new_key
from boundedcode_gateway.access.tokens import mint_task_token, verify_task_token
from boundedcode_gateway.cli.main import main
from tests.e2e.test_cli import free_port, start_serve, write_config
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.server import serve_in_thread

OLD = "the-old-token-secret-0123456789abcdef"
NEW = "the-new-token-secret-0123456789abcdef"
NEWER = "the-newer-token-secret-0123456789abcd"
ASK: Any = [{"role": "user", "content": "hello"}]
# how long a closed stream may take to end after the reload is applied
STREAM_END_S = 5.0


class Serve:
    """A ``serve`` subprocess, its configuration file, and an admin key it takes."""

    def __init__(self, proc: subprocess.Popen[bytes], config: Path, port: int, admin: str):
        self.proc = proc
        self.config = config
        self.url = f"http://127.0.0.1:{port}"
        self.admin = admin

    def settings(self) -> dict[str, Any]:
        loaded: dict[str, Any] = yaml.safe_load(self.config.read_text())
        return loaded

    def rewrite(self, change: Callable[[dict[str, Any]], None]) -> None:
        settings = self.settings()
        change(settings)
        self.config.write_text(yaml.safe_dump(settings))

    def reload(self, result: str = "applied") -> None:
        """SIGHUP, and wait until the gateway counted one more reload with ``result``."""
        before = self.reloads().get(result, 0)
        os.kill(self.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 20
        while self.reloads().get(result, 0) <= before:
            assert time.monotonic() < deadline, f"no reload {result}"
            time.sleep(0.05)

    def reloads(self) -> dict[str, float]:
        text = httpx.get(
            self.url + "/metrics", headers={"Authorization": f"Bearer {self.admin}"}, timeout=10
        ).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("boundedcode_gateway_config_reloads_total{"):
                labels, value = line.rsplit(" ", 1)
                out[labels.split('result="')[1].split('"')[0]] = float(value)
        return out

    def chat(self, credential: str) -> httpx.Response:
        body = {"model": "local", "messages": ASK}
        headers = {"Authorization": f"Bearer {credential}"}
        return httpx.post(self.url + "/v1/chat/completions", json=body, headers=headers, timeout=10)

    def message(self, credential: str) -> httpx.Response:
        body = {"model": "local", "max_tokens": 20, "messages": ASK}
        headers = {"Authorization": f"Bearer {credential}", "anthropic-version": "2023-06-01"}
        return httpx.post(self.url + "/v1/messages", json=body, headers=headers, timeout=10)


ServeFactory = Callable[..., Serve]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeFactory]:
    fake = FakeLlamaServer()
    procs: list[subprocess.Popen[bytes]] = []
    with serve_in_thread(fake.app) as upstream:

        def start(**auth: Any) -> Serve:
            admin = new_key()
            entry = {"name": "ops", "sha256": key_digest(admin), "models": ["*"], "admin": True}
            keys = [entry, *auth.pop("keys", [])]
            config = write_config(tmp_path, upstream.url, auth={"keys": keys, **auth})
            port = free_port()
            proc = start_serve(config, port)
            procs.append(proc)
            return Serve(proc, config, port, admin)

        yield start
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)


def secret_file(tmp_path: Path, *secrets: str) -> Path:
    path = tmp_path / "token-secret"
    path.write_text("".join(s + "\n" for s in secrets))
    path.chmod(0o600)
    return path


def token(secret: str, ttl_s: float = 600, max_ttl_s: float = 86_400) -> str:
    return mint_task_token(secret, task="t-1", models=["local"], ttl_s=ttl_s, max_ttl_s=max_ttl_s)


def refused_in_openai_words(resp: httpx.Response, words: str) -> None:
    assert resp.status_code == 401, resp.text
    error = resp.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_api_key")
    assert words in error["message"]
    assert resp.headers["www-authenticate"] == "Bearer"


def refused_in_anthropic_words(resp: httpx.Response, words: str) -> None:
    assert resp.status_code == 401, resp.text
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert words in body["error"]["message"]


def test_a_new_secret_in_the_file_revokes_every_old_token_at_the_reload(
    serve: ServeFactory, tmp_path: Path
) -> None:
    path = secret_file(tmp_path, OLD)
    gw = serve(token_secret_file=str(path))
    old = token(OLD)
    assert gw.chat(old).status_code == 200
    assert gw.message(old).status_code == 200

    path.write_text(NEW + "\n")
    gw.reload()
    refused_in_openai_words(gw.chat(old), "Invalid task token")
    refused_in_anthropic_words(gw.message(old), "Invalid task token")
    new = token(NEW)
    assert gw.chat(new).status_code == 200

    # a rotation with grace: the previous secret on the second line still verifies
    path.write_text(f"{NEWER}\n{NEW}\n")
    gw.reload()
    assert (gw.chat(token(NEWER)).status_code, gw.chat(new).status_code) == (200, 200)
    refused_in_openai_words(gw.chat(old), "Invalid task token")
    # ended by the next reload without it
    path.write_text(NEWER + "\n")
    gw.reload()
    refused_in_openai_words(gw.chat(new), "Invalid task token")
    assert gw.chat(token(NEWER)).status_code == 200


def test_a_secret_file_others_may_read_is_refused_and_the_running_secret_kept(
    serve: ServeFactory, tmp_path: Path
) -> None:
    path = secret_file(tmp_path, OLD)
    gw = serve(token_secret_file=str(path))
    path.write_text(NEW + "\n")
    path.chmod(0o644)
    gw.reload(result="refused")
    assert gw.chat(token(OLD)).status_code == 200
    refused_in_openai_words(gw.chat(token(NEW)), "Invalid task token")


def test_the_token_command_signs_with_the_files_first_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = secret_file(tmp_path, NEW, OLD)
    config = write_config(tmp_path, "http://127.0.0.1:9", auth={"token_secret_file": str(path)})
    argv = ["token", "--task", "t-1", "--models", "local", "--ttl", "1h", "--config", str(config)]
    assert main(argv) == 0
    minted = capsys.readouterr().out.strip()
    assert verify_task_token(NEW.encode(), minted, time.time()).task == "t-1"


def test_a_token_living_longer_than_the_maximum_in_force_is_refused(
    serve: ServeFactory, tmp_path: Path
) -> None:
    path = secret_file(tmp_path, OLD)
    gw = serve(token_secret_file=str(path), max_token_ttl_s=3600)
    # made by something that did not hold it to this gateway's maximum
    two_hours = token(OLD, ttl_s=7200)
    hour = token(OLD, ttl_s=3600)
    assert gw.chat(hour).status_code == 200
    refused_in_openai_words(gw.chat(two_hours), "lives 7200 s, longer than the 3600 s")
    refused_in_anthropic_words(gw.message(two_hours), "lives 7200 s, longer than the 3600 s")

    def max_ttl(seconds: int) -> Callable[[dict[str, Any]], None]:
        return lambda s: s["auth"].update(max_token_ttl_s=seconds)

    gw.rewrite(max_ttl(7200))
    gw.reload()
    assert gw.chat(two_hours).status_code == 200
    gw.rewrite(max_ttl(1800))
    gw.reload()
    refused_in_openai_words(gw.chat(hour), "lives 3600 s, longer than the 1800 s")


def test_the_token_command_refuses_a_ttl_past_the_maximum(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = secret_file(tmp_path, NEW)
    auth: dict[str, Any] = {"token_secret_file": str(path)}
    config = write_config(tmp_path, "http://127.0.0.1:9", auth=auth)
    argv = ["token", "--task", "t-1", "--models", "local", "--config", str(config)]
    assert main([*argv, "--ttl", "2d"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "172800 s is longer than the 86400 s a token may live (auth.max_token_ttl_s)" in (
        captured.err
    )
    config = write_config(tmp_path, "http://127.0.0.1:9", auth={**auth, "max_token_ttl_s": 172800})
    assert main([*argv, "--ttl", "2d"]) == 0


class EventStream:
    """The page's event stream, read in a thread: its lines, and when it ended."""

    def __init__(self, url: str, key: str) -> None:
        self.lines: list[str] = []
        self.ended = threading.Event()
        self.opened = threading.Event()
        self.status: int | None = None
        self._url, self._key = url + "/ui/api/events", key
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self.opened.wait(10), "the event stream did not open"

    def _read(self) -> None:
        headers = {"Authorization": f"Bearer {self._key}"}
        # the read timeout is past the keep-alive's 15 s: only the gateway ends the stream
        timeout = httpx.Timeout(10, read=60)
        try:
            with httpx.stream("GET", self._url, headers=headers, timeout=timeout) as resp:
                self.status = resp.status_code
                self.opened.set()
                for line in resp.iter_lines():
                    self.lines.append(line)
        finally:
            self.opened.set()
            self.ended.set()

    def saw(self, text: str, timeout_s: float = 10) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.05)
        return False


def viewer_entry(key: str, admin: bool = True) -> dict[str, Any]:
    return {"name": "viewer", "sha256": key_digest(key), "models": ["*"], "admin": admin}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda s: s["auth"].update(keys=s["auth"]["keys"][:1]), id="key removed"),
        pytest.param(
            lambda s: s["auth"]["keys"][1].update(sha256=key_digest(new_key())), id="key changed"
        ),
        pytest.param(lambda s: s["auth"]["keys"][1].update(admin=False), id="made non-admin"),
        pytest.param(lambda s: s.update(ui=False), id="page turned off"),
    ],
)
def test_an_open_event_stream_ends_when_a_reload_takes_its_key_away(
    serve: ServeFactory, change: Callable[[dict[str, Any]], None]
) -> None:
    viewer = new_key()
    gw = serve(keys=[viewer_entry(viewer)])
    stream = EventStream(gw.url, viewer)
    assert stream.status == 200 and stream.saw("event: in_flight")
    gw.rewrite(change)
    gw.reload()
    assert stream.ended.wait(STREAM_END_S), "the stream outlived its key's removal"


def test_an_event_stream_whose_key_a_reload_keeps_goes_on(serve: ServeFactory) -> None:
    viewer = new_key()
    gw = serve(keys=[viewer_entry(viewer)])
    stream = EventStream(gw.url, viewer)
    assert stream.saw("event: in_flight")
    # another key changes; this one is kept
    gw.rewrite(lambda s: s["auth"]["keys"].append(viewer_entry(new_key()) | {"name": "other"}))
    gw.reload()
    assert gw.chat(gw.admin).status_code == 200
    assert stream.saw("event: finished"), "the kept viewer was not told of the call"
    assert not stream.ended.is_set()
    # and the gateway's own stop ends it
    gw.proc.send_signal(signal.SIGTERM)
    assert stream.ended.wait(STREAM_END_S)
