"""A local profile's servers: ``servers``, ``replicas``, ``replica_extra_args`` and ``routing``,
the one form every profile's servers take, and each mistake's message with its line."""

from __future__ import annotations

import pytest

from boundedcode_gateway.cli.llama_server import command_for
from boundedcode_gateway.config import ModelProfile, PoolServer, ServerSettings, parse_config
from boundedcode_gateway.errors import ConfigError


def _profile(body: str) -> ModelProfile:
    return parse_config("models:\n  l:\n" + body, "<c>").models["l"]


def test_a_list_of_servers_keeps_each_entry_and_its_own_settings() -> None:
    profile = _profile(
        "    provider: local\n"
        "    routing: least_busy\n"
        "    servers:\n"
        "      - external_url: http://127.0.0.1:8081\n"
        "        server: {cache_repair: false}\n"
        "      - model_path: /models/m.gguf\n"
        "        server: {parallel: 2, extra_args: [--metrics]}\n"
    )
    assert profile.routing_policy == "least_busy"
    assert profile.pool_servers() == (
        PoolServer(external_url="http://127.0.0.1:8081", server=ServerSettings(cache_repair=False)),
        PoolServer(
            model_path="/models/m.gguf",
            server=ServerSettings(parallel=2, extra_args=("--metrics",)),
        ),
    )


def test_replicas_share_the_server_settings_and_add_their_own_flags_after_them() -> None:
    profile = _profile(
        "    provider: local\n"
        "    model_path: /models/m.gguf\n"
        "    replicas: 2\n"
        "    server: {parallel: 2, extra_args: [--metrics]}\n"
        "    replica_extra_args: [[--device, CUDA0], [--device, CUDA1]]\n"
    )
    assert profile.routing_policy == "affinity"
    servers = profile.pool_servers()
    assert [s.model_path for s in servers] == ["/models/m.gguf"] * 2
    assert [s.server.parallel for s in servers if s.server] == [2, 2]
    assert [s.server.extra_args for s in servers if s.server] == [
        ("--metrics", "--device", "CUDA0"),
        ("--metrics", "--device", "CUDA1"),
    ]


def test_replicas_without_settings_or_extra_flags() -> None:
    profile = _profile("    provider: local\n    model_path: /m.gguf\n    replicas: 3\n")
    assert (
        profile.pool_servers() == (PoolServer(model_path="/m.gguf", server=ServerSettings()),) * 3
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "    external_url: http://127.0.0.1:8080\n    server: {cache_repair: false}\n",
            PoolServer(
                external_url="http://127.0.0.1:8080", server=ServerSettings(cache_repair=False)
            ),
        ),
        ("    model_path: /m.gguf\n", PoolServer(model_path="/m.gguf")),
        (
            "    model_path: /m.gguf\n    replicas: 1\n",
            PoolServer(model_path="/m.gguf", server=ServerSettings()),
        ),
        (
            "    servers: [{external_url: http://127.0.0.1:8080}]\n",
            PoolServer(external_url="http://127.0.0.1:8080"),
        ),
    ],
)
def test_one_server_is_a_pool_of_one(body: str, expected: PoolServer) -> None:
    profile = _profile("    provider: local\n" + body)
    assert profile.pool_servers() == (expected,)
    assert profile.routing_policy == "affinity"


def test_a_remote_profile_has_no_servers_of_its_own() -> None:
    profile = _profile("    provider: openai\n    api_key_env: OPENAI_API_KEY\n")
    assert profile.pool_servers() == ()


# each mistake, with the whole message: the key (and its line) it names, and what to do
MISTAKES = [
    (
        "    provider: local\n",
        "<c>:2: models.l: provider 'local' needs exactly one of 'external_url' (a running "
        "server), 'model_path' (a GGUF file the gateway serves with llama-server) or "
        "'servers' (several servers of the model)",
    ),
    (
        "    provider: local\n    external_url: http://a:1\n"
        "    servers: [{external_url: http://b:1}]\n",
        "<c>:5: models.l.servers: 'servers' lists every server of the profile: make "
        "'external_url' one of its entries, or remove 'servers'",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    servers: [{model_path: /n.gguf}]\n",
        "<c>:5: models.l.servers: 'servers' lists every server of the profile: make "
        "'model_path' one of its entries, or remove 'servers'",
    ),
    (
        "    provider: local\n    server: {parallel: 2}\n    servers: [{model_path: /m.gguf}]\n",
        "<c>:5: models.l.servers: with 'servers', give the 'server' settings in each entry "
        "that needs them, not in the profile",
    ),
    (
        "    provider: local\n    servers: []\n",
        "<c>:4: models.l.servers: 'servers' lists one or more servers",
    ),
    (
        "    provider: local\n    servers: {external_url: http://a:1}\n",
        "<c>:4: models.l.servers: 'servers' is a list of servers, each with 'external_url' "
        "or 'model_path'",
    ),
    (
        "    provider: local\n    servers:\n      - model_path: /m.gguf\n"
        "      - {external_url: http://a:1, model_path: /m.gguf}\n",
        "<c>:6: models.l.servers.1: each server needs exactly one of 'external_url' (a "
        "running server) or 'model_path' (a GGUF file the gateway serves with llama-server)",
    ),
    (
        "    provider: local\n    servers:\n      - server: {parallel: 2}\n",
        "<c>:5: models.l.servers.0: each server needs exactly one of 'external_url'",
    ),
    (
        "    provider: local\n    servers:\n      - external_url: http://a:1\n"
        "        server: {parallel: 2, cache_repair: false}\n",
        "<c>:5: models.l.servers.0: 'server' settings other than 'cache_repair' and "
        "'slot_save_path' apply only to a managed server ('model_path'), not: parallel",
    ),
    (
        "    provider: local\n    servers:\n      - model_path: /m.gguf\n        colour: red\n",
        "<c>:6: models.l.servers.0.colour: unknown key",
    ),
    (
        "    provider: local\n    servers:\n      - external_url: http://a:1\n"
        "      - model_path: /m.gguf\n      - external_url: http://a:1/\n",
        "<c>:4: models.l.servers: entries 0 and 2 are the same server (http://a:1/)",
    ),
    (
        "    provider: local\n    external_url: http://a:1\n    replicas: 2\n",
        "<c>:5: models.l.replicas: 'replicas' goes with 'model_path' (that many servers of "
        "it, run by the gateway); servers you run are listed under 'servers'",
    ),
    (
        "    provider: local\n    servers: [{model_path: /m.gguf}]\n    replicas: 2\n",
        "<c>:5: models.l.replicas: 'replicas' goes with 'model_path'",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    replicas: 0\n",
        "<c>:5: models.l.replicas: Input should be greater than or equal to 1",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    replica_extra_args: [[--a]]\n",
        "<c>:5: models.l.replica_extra_args: 'replica_extra_args' needs 'replicas': one "
        "list of flags per replica",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    replicas: 2\n"
        "    replica_extra_args: [[--a]]\n",
        "<c>:6: models.l.replica_extra_args: 1 list(s) of flags for 2 replica(s); give one "
        "per replica ([] for none)",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    replicas: 2\n"
        "    replica_extra_args: [--a, --b]\n",
        "<c>:6: models.l.replica_extra_args: give one list of flags per replica, e.g. "
        "[[--device, CUDA0], [--device, CUDA1]]",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    replicas: 2\n"
        "    replica_extra_args: [[--a], [3]]\n",
        "<c>:6: models.l.replica_extra_args.1.0: Input should be a valid string",
    ),
    (
        "    provider: local\n    external_url: http://a:1\n    routing: affinity\n",
        "<c>:5: models.l.routing: 'routing' chooses among several servers and this profile "
        "has one; give it 'servers' or 'replicas' (2 or more), or remove 'routing'",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    replicas: 1\n    routing: affinity\n",
        "<c>:6: models.l.routing: 'routing' chooses among several servers",
    ),
    (
        "    provider: local\n    servers: [{external_url: http://a:1}]\n"
        "    routing: round_robin\n",
        "<c>:5: models.l.routing: 'routing' chooses among several servers",
    ),
    (
        "    provider: local\n    model_path: /m.gguf\n    replicas: 2\n    routing: fastest\n",
        "<c>:6: models.l.routing: Input should be 'affinity', 'least_busy' or 'round_robin'",
    ),
    (
        "    provider: openai\n    api_key_env: K\n    replicas: 2\n    routing: affinity\n",
        "<c>:2: models.l: 'replicas' and 'routing' are only for provider 'local', not 'openai'",
    ),
    (
        "    provider: anthropic\n    api_key_env: K\n    servers: [{external_url: http://a:1}]\n",
        "<c>:2: models.l: 'servers' is only for provider 'local', not 'anthropic'",
    ),
    (
        "    provider: openai\n    api_key_env: K\n    external_url: http://a:1\n",
        "<c>:2: models.l: 'external_url' is only for provider 'local', not 'openai'",
    ),
]


@pytest.mark.parametrize(("body", "expected"), MISTAKES)
def test_each_mistake_names_its_key_line_and_remedy(body: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        _profile(body)
    assert str(info.value).startswith(expected), str(info.value)


def test_the_command_of_one_replica_is_not_printed() -> None:
    config = parse_config(
        "models:\n  l:\n    provider: local\n    model_path: /m.gguf\n    replicas: 2\n"
    )
    with pytest.raises(ConfigError, match=r"models\.l: 'replicas' runs several servers"):
        command_for(config, "l", 8081)
