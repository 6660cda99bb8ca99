"""A managed llama-server's environment: an allow-list of the gateway's, what the profile
sets, and a fresh key each start; the key reaches every request to that server alone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from boundedcode_gateway.config import ServerSettings
from boundedcode_gateway.llama_server.environment import (
    API_KEY_VAR,
    CLOSED_CORS_ENV,
    new_api_key,
    passed,
    server_environment,
)
from boundedcode_gateway.llama_server.flags import ServerCommand, server_command
from boundedcode_gateway.llama_server.launcher import ManagedLlamaServer
from boundedcode_gateway.llama_server.pool import PoolMember, ServerPool
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.upstream.http import HttpClient, Timeouts

GATEWAY_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/gw",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TZ": "UTC",
    "LD_LIBRARY_PATH": "/opt/cuda/lib64",
    "CUDA_VISIBLE_DEVICES": "0",
    "HIP_VISIBLE_DEVICES": "1",
    "GGML_CUDA_NO_PINNED": "1",
    "OMP_NUM_THREADS": "4",
    # what the server must never see
    "OPENAI_API_KEY": "sk-cloud-key",
    "ANTHROPIC_API_KEY": "sk-ant-key",
    "BOUNDEDCODE_TOKEN_SECRET": "token-secret-0123456789abcdef",
    "DATABASE_URL": "postgresql://gw:pw@db/gw",
    "HTTPS_PROXY": "http://user:pw@proxy:3128",
    "HF_TOKEN": "hf_secret",
    "AWS_SECRET_ACCESS_KEY": "aws",
    # what would change the server's own settings behind the gateway's back
    "LLAMA_ARG_HOST": "0.0.0.0",
    "LLAMA_ARG_CORS_ORIGINS": "*",
    "LLAMA_API_KEY": "operator-key",
    "LLAMA_ARG_API_KEY_FILE": "/tmp/keys",
    "LLAMA_SERVER_SLOTS_DEBUG": "0",
}
KEPT = {
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "LD_LIBRARY_PATH",
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "GGML_CUDA_NO_PINNED",
    "OMP_NUM_THREADS",
}


def test_the_server_gets_the_allow_list_the_profile_and_its_key() -> None:
    env = server_environment(GATEWAY_ENV, {"GGML_OP_OFFLOAD_MIN_BATCH": "64"}, "k-1")
    assert env == {
        **{name: GATEWAY_ENV[name] for name in KEPT},
        "GGML_OP_OFFLOAD_MIN_BATCH": "64",
        API_KEY_VAR: "k-1",
    }


def test_no_secret_of_the_gateway_reaches_the_server() -> None:
    env = server_environment(GATEWAY_ENV, {}, "k-1")
    values = set(env.values())
    for name in ("OPENAI_API_KEY", "BOUNDEDCODE_TOKEN_SECRET", "DATABASE_URL", "HF_TOKEN"):
        assert name not in env and GATEWAY_ENV[name] not in values
    assert "LLAMA_ARG_HOST" not in env and env[API_KEY_VAR] == "k-1"


def test_pass_env_names_more_but_never_the_key() -> None:
    env = server_environment(GATEWAY_ENV, {}, "k-1", ("HF_TOKEN", "HTTPS_PROXY", "UNSET_VAR"))
    assert env["HF_TOKEN"] == "hf_secret" and env["HTTPS_PROXY"] == GATEWAY_ENV["HTTPS_PROXY"]
    assert "UNSET_VAR" not in env
    assert not passed(API_KEY_VAR, {API_KEY_VAR})
    assert not passed("LLAMA_ARG_CORS_ORIGINS", {"LLAMA_ARG_CORS_ORIGINS"})


def test_the_command_sets_closed_cors_and_no_key_in_argv() -> None:
    settings = ServerSettings.model_validate({"pass_env": ["HF_TOKEN"]})
    cmd = server_command("llama-server", "/m.gguf", 9000, "local", settings)
    assert cmd.env.items() >= CLOSED_CORS_ENV.items()
    assert cmd.pass_env == ("HF_TOKEN",)
    assert not any("key" in arg.lower() for arg in cmd.argv)


def test_each_key_is_fresh() -> None:
    keys = {new_api_key() for _ in range(100)}
    assert len(keys) == 100 and all(len(k) >= 43 for k in keys)


@pytest.mark.parametrize(
    ("server", "message"),
    [
        ({"pass_env": ["LLAMA_API_KEY"]}, "set by the gateway"),
        ({"pass_env": ["LLAMA_ARG_CORS_ORIGINS"]}, "set by the gateway"),
        ({"pass_env": ["not a name"]}, "not the name of an environment variable"),
        ({"extra_args": ["--api-key", "k"]}, "--api-key: the gateway gives each server"),
        ({"extra_args": ["--api-key-file=/k"]}, "--api-key-file"),
        ({"extra_args": ["--cors-origins", "*"]}, "--cors-origins"),
    ],
)
def test_settings_that_would_reopen_the_server_are_refused(
    server: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerSettings.model_validate(server)


def _managed(tmp_path: Path, http: HttpClient) -> ManagedLlamaServer:
    return ManagedLlamaServer(
        "m", lambda port: ServerCommand(("true",)), tmp_path / "m.log", 1.0, http
    )


def test_a_request_carries_the_key_of_the_server_it_goes_to(tmp_path: Path) -> None:
    async def run() -> None:
        http = HttpClient(Timeouts(2.0, 2.0))
        try:
            first, second = _managed(tmp_path, http), _managed(tmp_path, http)
            first._port, first._key = 41001, "key-of-first"
            second._port, second._key = 41002, "key-of-second"
            members = [
                PoolMember(ServerState("m[0]"), None, first),
                PoolMember(ServerState("m[1]"), None, second),
                PoolMember(ServerState("ext"), "http://127.0.0.1:41003"),
            ]
            pool = ServerPool("m", members, "affinity", http, lambda: {"Authorization": "P"})
            url = "http://127.0.0.1:41001/v1/chat/completions"
            assert pool.headers_for(url) == {"Authorization": "Bearer key-of-first"}
            assert pool.headers_for("http://127.0.0.1:41002") == {
                "Authorization": "Bearer key-of-second"
            }
            # a server the gateway does not run gets the profile's key; a port that only
            # begins like a managed one's is another server
            assert pool.headers_for("http://127.0.0.1:41003/slots") == {"Authorization": "P"}
            assert pool.headers_for("http://127.0.0.1:410011/slots") == {"Authorization": "P"}
            # restarted on another port: the old port's requests carry no key of it
            first._port, first._key = 41004, "key-of-first-again"
            assert pool.headers_for(url) == {"Authorization": "P"}
        finally:
            await http.close()

    asyncio.run(run())
