"""``seal-key rotate`` and ``list``: a new key signs once the gateway reloads, the previous
one still verifies, a key rotated out no longer does; only key ids are printed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from boundedcode_gateway.cli.main import main
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.fronts.sealing import KEY_FILE, key_id, parse_ring
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply

VERSION = {"anthropic-version": "2023-06-01"}
ASK: list[Any] = [{"role": "user", "content": "What is in README.md?"}]


def signature_key(gw: Gateway, upstreams: Upstreams) -> str:
    """The key id of the signature of a thinking block the gateway hands out now."""
    upstreams.llama.queue(Reply(content="It describes the gateway.", reasoning_content="Read it."))
    body = {"model": "local", "max_tokens": 100, "messages": ASK}
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        resp = http.post("/v1/messages", json=body, headers=VERSION)
    assert resp.status_code == 200, resp.text
    signature: str = resp.json()["content"][0]["signature"]
    return signature.split(".")[1]


def rotate(config: Path, capsys: pytest.CaptureFixture[str], *keep: str) -> list[str]:
    assert main(["seal-key", "rotate", "--config", str(config), *keep]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_rotation_signs_with_a_new_key_after_a_reload(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tmp_path / "data"
    config = tmp_path / "gateway.yaml"
    text = yaml.safe_dump({"data_dir": str(data), "models": upstreams.profiles})
    config.write_text(text)
    gw = start_gateway(upstreams.profiles, data_dir=data)
    first = signature_key(gw, upstreams)
    assert main(["seal-key", "list", "--config", str(config)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"signing key: {first}"]

    lines = rotate(config, capsys)
    ring = parse_ring((data / KEY_FILE).read_bytes())
    second = key_id(ring[0])
    assert lines == [f"signing key: {second}", f"verifying key: {first}"]
    # no key is printed, only ids
    assert all(key.hex() not in "".join(lines) for key in ring)
    assert signature_key(gw, upstreams) == first  # until the gateway reloads
    future = asyncio.run_coroutine_threadsafe(gw.app.reload(parse_config(text)), gw.app.loop)  # type: ignore[arg-type]
    assert future.result(30).applied
    assert signature_key(gw, upstreams) == second
    assert gw.app.sealer.key_ids == [second, first]

    lines = rotate(config, capsys, "--keep", "2")
    third = lines[0].removeprefix("signing key: ")
    assert lines == [f"signing key: {third}", f"verifying key: {second}", f"removed key: {first}"]


def test_a_reload_keeps_the_running_ring_when_the_file_is_broken(
    upstreams: Upstreams, start_gateway: GatewayFactory, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    text = yaml.safe_dump({"data_dir": str(data), "models": upstreams.profiles})
    gw = start_gateway(upstreams.profiles, data_dir=data)
    before = signature_key(gw, upstreams)
    (data / KEY_FILE).write_bytes(b"not a ring")
    future = asyncio.run_coroutine_threadsafe(gw.app.reload(parse_config(text)), gw.app.loop)  # type: ignore[arg-type]
    assert future.result(30).applied
    assert signature_key(gw, upstreams) == before
