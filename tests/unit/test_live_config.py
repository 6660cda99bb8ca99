"""``live_config.py``: what a new configuration keeps of the running one, and what it
replaces; a route counts its calls until they end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from boundedcode_gateway.config import GatewayConfig, parse_config
from boundedcode_gateway.live_config import (
    LiveConfig,
    Route,
    build_live_config,
    restart_only_changes,
    route_changes,
)
from boundedcode_gateway.upstream.http import HttpClient, Timeouts

EXTERNAL = {"provider": "local", "external_url": "http://127.0.0.1:9"}
CLOUD = {"provider": "openai", "api_key_env": "SOME_KEY", "model": "gpt-5.1"}


@pytest.fixture
def http() -> Iterator[HttpClient]:
    yield HttpClient(Timeouts(1.0, 1.0))  # never used to send: nothing is started


def config_of(models: dict[str, Any], **settings: Any) -> GatewayConfig:
    return parse_config(yaml.safe_dump({"data_dir": "unused", **settings, "models": models}))


def test_a_new_configuration_keeps_the_routes_of_unchanged_profiles(http: HttpClient) -> None:
    old = build_live_config(config_of({"a": EXTERNAL, "b": CLOUD}), http)
    changed_b = {**CLOUD, "retry": {"max_attempts": 2}}
    new = build_live_config(config_of({"a": EXTERNAL, "b": changed_b, "c": CLOUD}), http, old)
    assert new.routes["a"] is old.routes["a"]
    assert new.routes["b"] is not old.routes["b"]
    assert new.routes["b"].upstream is not old.routes["b"].upstream
    changes = route_changes(old, new)
    assert (changes.added, changes.changed, changes.removed, changes.unchanged) == (
        ("c",),
        ("b",),
        (),
        ("a",),
    )
    assert changes.describe() == "added c; changed b; unchanged a"
    gone = build_live_config(config_of({"b": changed_b}), http, new)
    assert route_changes(new, gone).removed == ("a", "c")


def test_a_setting_a_profile_inherits_is_part_of_the_profile(http: HttpClient) -> None:
    own = {**EXTERNAL, "reasoning_history": "keep"}
    old = build_live_config(config_of({"inherits": EXTERNAL, "own": own}), http)
    new = build_live_config(
        config_of({"inherits": EXTERNAL, "own": own}, inference={"reasoning_history": "drop"}),
        http,
        old,
    )
    assert new.routes["inherits"] is not old.routes["inherits"]
    assert new.routes["own"] is old.routes["own"]


def test_the_llama_server_binary_matters_to_managed_profiles_only(
    http: HttpClient, tmp_path: Path
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    binaries = []
    for name in ("one", "two"):
        binary = tmp_path / name
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        binaries.append(str(binary))
    models = {"managed": {"provider": "local", "model_path": str(model)}, "ext": EXTERNAL}
    old = build_live_config(config_of(models, llama_server_bin=binaries[0]), http)
    new = build_live_config(config_of(models, llama_server_bin=binaries[1]), http, old)
    assert new.routes["ext"] is old.routes["ext"]
    assert new.routes["managed"] is not old.routes["managed"]
    again = build_live_config(config_of(models, llama_server_bin=binaries[1]), http, new)
    assert again.routes["managed"] is new.routes["managed"]


VARIANTS: list[dict[str, Any]] = [
    EXTERNAL,
    {**EXTERNAL, "external_url": "http://127.0.0.1:10"},
    CLOUD,
    {**CLOUD, "model": "gpt-5.2"},
    {**CLOUD, "retry": {"max_total_s": 5}},
]
PROFILE_MAPS = st.dictionaries(
    st.sampled_from(["p", "q", "r", "s"]), st.integers(0, len(VARIANTS) - 1), min_size=1
)


@settings(max_examples=60, deadline=None)
@given(PROFILE_MAPS, PROFILE_MAPS)
def test_a_route_is_kept_exactly_when_its_profile_is_equal(
    before: dict[str, int], after: dict[str, int]
) -> None:
    http = HttpClient(Timeouts(1.0, 1.0))
    old = build_live_config(config_of({n: VARIANTS[v] for n, v in before.items()}), http)
    new = build_live_config(config_of({n: VARIANTS[v] for n, v in after.items()}), http, old)
    assert set(new.routes) == set(after)
    for name, variant in after.items():
        kept = new.routes[name] is old.routes.get(name)
        assert kept == (before.get(name) == variant), name
    changes = route_changes(old, new)
    everything = changes.added + changes.changed + changes.unchanged
    assert sorted(everything) == sorted(after)
    assert sorted(changes.removed) == sorted(set(before) - set(after))


def test_settings_read_only_at_start_are_named() -> None:
    old = config_of({"a": EXTERNAL})
    assert restart_only_changes(old, config_of({"a": CLOUD}, max_body_mib=1)) == []
    new = config_of(
        {"a": EXTERNAL},
        data_dir="elsewhere",
        metering=False,
        inference={"read_timeout_s": 5, "reasoning_history": "drop"},
    )
    assert restart_only_changes(old, new) == ["data_dir", "metering", "inference.read_timeout_s"]


async def test_a_route_is_idle_once_its_last_call_left(http: HttpClient) -> None:
    live: LiveConfig = build_live_config(config_of({"a": EXTERNAL}), http)
    route: Route = live.routes["a"]
    await asyncio.wait_for(route.idle(), 1.0)  # no call: idle at once
    route.enter()
    route.enter()
    idle = asyncio.ensure_future(route.idle())
    await asyncio.sleep(0.01)  # it waits
    route.leave()
    await asyncio.sleep(0.01)
    assert not idle.done() and route.in_flight == 1
    route.leave()
    await asyncio.wait_for(idle, 1.0)
    assert live.max_body_bytes == 32 * 1024 * 1024
