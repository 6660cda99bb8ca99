"""GET /v1/models follows the Capabilities table of docs/providers.md; requests needing what
a model lacks get a clear 400."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams


def models(gw: Gateway) -> dict[str, dict[str, Any]]:
    body = httpx.get(gw.url + "/v1/models", timeout=10).json()
    assert body["object"] == "list"
    return {m["id"]: m for m in body["data"]}


def test_capabilities_by_kind(gateway: Gateway, upstreams: Upstreams) -> None:
    got = models(gateway)
    assert set(got) == {"local", "other", "gpt", "glm"}
    caps = {name: m["capabilities"] for name, m in got.items()}
    # local llama.cpp: read from /props; its template renders reasoning_content
    assert caps["local"]["source"] == "props"
    assert caps["local"]["reasoning_back"] is True
    assert caps["local"]["prompt_progress"] is True
    assert caps["local"]["context_tokens"] == upstreams.llama.n_ctx
    # another local server without /props: assumed
    assert caps["other"]["source"] == "assumed"
    assert caps["other"]["reasoning_back"] is False
    assert caps["other"]["prompt_progress"] is False
    for cloud in ("gpt", "glm"):
        assert caps[cloud]["source"] == "documentation"
        assert caps[cloud]["reasoning_back"] is False
        assert caps[cloud]["prompt_progress"] is False
    for c in caps.values():
        assert c["streaming"] is True and c["structured_output"] is True
    assert got["gpt"]["object"] == "model" and got["gpt"]["owned_by"] == "openai"
    assert got["gpt"]["upstream_model"] == "gpt-5.1"
    one = httpx.get(gateway.url + "/v1/models/local", timeout=10).json()
    # one model asked for by name: its servers too, a local one's
    servers = one.pop("servers")
    assert one == got["local"]
    assert servers == [{"name": upstreams.profiles["local"]["external_url"], "state": "ready"}]
    assert "servers" not in httpx.get(gateway.url + "/v1/models/gpt", timeout=10).json()
    # /props is read once, however often capabilities are asked for
    models(gateway)
    assert len([r for r in upstreams.llama.requests if r.path == "/props"]) == 1


def test_template_without_preserved_reasoning(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    upstreams.llama.supports_preserve_reasoning = False
    gw = start_gateway(upstreams.profiles)
    caps = models(gw)["local"]["capabilities"]
    assert caps["reasoning_back"] is False
    # a reasoning model whose template drops earlier reasoning: said, with what to do
    assert "supports_preserve_reasoning: false" in caps["reasoning_back_refusal"]
    assert "reasoning_content" in caps["reasoning_back_refusal"]
    # a setting that chose it gets no such note
    gw = start_gateway({"local": {**upstreams.profiles["local"], "reasoning_history": "drop"}})
    assert models(gw)["local"]["capabilities"]["reasoning_back_refusal"] is None


@pytest.mark.parametrize("newline", [True, False])
def test_budget_message_matches_a_template_with_a_newline_before_the_end(
    upstreams: Upstreams, start_gateway: GatewayFactory, newline: bool
) -> None:
    """The fake's template writes "reasoning\n</think>": a forced end gets that newline."""
    if not newline:
        upstreams.llama.close_reasoning = "</think>\n\n"
    gw = start_gateway(upstreams.profiles)
    client = gw.client()
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    client.chat.completions.create(
        model="local", messages=messages, extra_body={"reasoning_budget_tokens": 10}
    )
    client.chat.completions.create(model="local", messages=messages)  # no budget
    with_budget, without = (
        r.body for r in upstreams.llama.requests if r.path.endswith("/completions")
    )
    sent = with_budget.get("reasoning_budget_message")
    assert sent == ("\n" if newline else None)
    assert "reasoning_budget_message" not in without
    first = gw.calls()[0]
    assert first["adjustments"].get("reasoning_budget_message") == sent


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("keep", {"local": True, "other": True, "gpt": False, "glm": True}),
        ("drop", {"local": False, "other": False, "gpt": False, "glm": False}),
    ],
)
def test_reasoning_history_setting(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    setting: str,
    expected: dict[str, bool],
) -> None:
    gw = start_gateway(upstreams.profiles, inference={"reasoning_history": setting})
    got = {n: m["capabilities"]["reasoning_back"] for n, m in models(gw).items()}
    assert got == expected


def test_profile_overrides_the_setting(upstreams: Upstreams, start_gateway: GatewayFactory) -> None:
    profiles = {
        **upstreams.profiles,
        "glm": {**upstreams.profiles["glm"], "reasoning_history": "keep"},
    }
    gw = start_gateway(profiles)
    got = models(gw)
    assert got["glm"]["capabilities"]["reasoning_back"] is True
    assert got["other"]["capabilities"]["reasoning_back"] is False


HISTORY: list[Any] = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "hello", "reasoning_content": "be polite"},
    {"role": "user", "content": "again"},
]


def test_reasoning_goes_only_where_taken(gateway: Gateway, upstreams: Upstreams) -> None:
    client = gateway.client()
    for name in ("local", "other", "gpt", "glm"):
        client.chat.completions.create(model=name, messages=HISTORY)
    assert upstreams.llama.requests.last.body["messages"][1]["reasoning_content"] == "be polite"
    for fake in (upstreams.other_local, upstreams.openai, upstreams.compat):
        assert "reasoning_content" not in fake.requests.last.body["messages"][1]


def test_progress_to_a_model_without_it_is_400(gateway: Gateway, upstreams: Upstreams) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        gateway.client().chat.completions.create(
            model="gpt", messages=HISTORY[:1], stream=True, extra_body={"return_progress": True}
        )
    assert info.value.code == "capability_missing"
    assert "prompt progress" in info.value.message
    assert upstreams.openai.requests == []


def test_tools_to_a_template_without_tools_is_400(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    upstreams.llama.supports_tools = False
    gw = start_gateway(upstreams.profiles)
    tool: Any = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model="local", messages=HISTORY[:1], tools=[tool])
    assert info.value.code == "capability_missing" and "tool" in info.value.message
    assert [r.path for r in upstreams.llama.requests] == ["/props"]


def test_image_to_a_model_without_vision_is_400(gateway: Gateway, upstreams: Upstreams) -> None:
    image: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        }
    ]
    with pytest.raises(openai.BadRequestError) as info:
        gateway.client().chat.completions.create(model="local", messages=image)
    assert info.value.code == "capability_missing" and "images" in info.value.message
    # the cloud model is documented to take images: passed through
    gateway.client().chat.completions.create(model="gpt", messages=image)
    assert upstreams.openai.requests.last.body["messages"] == image
