"""Anthropic's Messages API at the gateway, with the official ``anthropic`` SDK as the
caller (Claude Code's stand-in) and the fake llama-server behind it: whole and streamed
answers the SDK's own types read, a tool loop whose reasoning goes back to the model,
errors in Anthropic's shape and statuses, the token count, and the call's record."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message

from boundedcode_gateway.access.keys import key_digest, new_key
from boundedcode_gateway.access.tokens import mint_task_token
from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.common import Reply

ASK: list[Any] = [{"role": "user", "content": "What is in README.md?"}]
TOOLS: list[Any] = [
    {
        "name": "read_file",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
]
VERSION = {"anthropic-version": "2023-06-01"}
NEWEST = {"anthropic-version": "2026-10-21"}


_OPEN: list[anthropic.Anthropic] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def sdk(
    gw: Gateway,
    *,
    task: str | None = None,
    base: str = "",
    version: str | None = None,
    **options: Any,
) -> anthropic.Anthropic:
    """The SDK as a caller of ``gw`` (closed after the test); ``base``: a path before /v1;
    ``version``: the API version it sends instead of its own (2026-10-21)."""
    headers = dict(options.pop("default_headers", {}))
    if task is not None:
        headers["X-BoundedCode-Task"] = task
    if version is not None:
        headers["anthropic-version"] = version
    options.setdefault("api_key", "unused")
    client = anthropic.Anthropic(
        base_url=gw.url + base, max_retries=0, default_headers=headers, **options
    )
    _OPEN.append(client)
    return client


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        yield client


def streamed(client: anthropic.Anthropic, **params: Any) -> tuple[Message, list[str]]:
    """The answer as the SDK's stream helper assembles it, and the events' types."""
    with client.messages.stream(**params) as stream:
        kinds: list[str] = [event.type for event in stream]
        return stream.get_final_message(), kinds


def test_a_whole_answer(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(Reply(content="It describes the gateway.", reasoning_content="Read it."))
    message = sdk(gateway).messages.create(
        model="local", max_tokens=200, messages=ASK, system="Be brief.", stop_sequences=["END"]
    )
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "Read it."  # type: ignore[union-attr]
    assert message.content[0].signature.startswith("bcg2.")  # type: ignore[union-attr]
    assert message.content[1].text == "It describes the gateway."  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.id.startswith("msg_")
    sent = upstreams.llama.requests.last.body
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, *ASK]
    assert sent["max_completion_tokens"] == 200 and sent["stop"] == ["END"]
    call = gateway.calls()[-1]
    assert call["front"] == "messages" and call["status"] == "ok"
    assert (
        message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
        == call["prompt_tokens"]
    )
    assert message.usage.output_tokens == call["completion_tokens"]
    assert gateway.ledger_rows()[-1]["front"] == "messages"


def test_a_request_shaped_as_claude_codes(gateway: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(Reply(content="Done.", reasoning_content="Easy."))
    final, _ = streamed(
        # Claude Code speaks 2023-06-01 and sends the sampling parameters it had
        sdk(gateway, task="cc", version="2023-06-01"),
        model="local",
        max_tokens=32000,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.69; cch=a5145;"},
            {
                "type": "text",
                "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"},
            },
        ],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
            }
        ],
        tools=TOOLS,
        metadata={"user_id": '{"device_id":"d1","session_id":"s1"}'},
        thinking={"type": "adaptive"},
        extra_body={
            "temperature": 1,
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"},
        },
    )
    assert final.content[-1].text == "Done."  # type: ignore[union-attr]
    sent = upstreams.llama.requests.last.body
    # the billing header's block, new on every request, never reaches the local server
    assert sent["messages"][0] == {
        "role": "system",
        "content": [{"type": "text", "text": "You are Claude Code."}],
    }
    assert (sent["reasoning_effort"], sent["user"]) == (
        "medium",
        '{"device_id":"d1","session_id":"s1"}',
    )
    call = gateway.calls()[-1]
    assert call["adjustments"]["volatile_lines_removed"] == ["claude_code_billing_header"]


def test_streamed_and_whole_answers_are_the_same(gateway: Gateway, upstreams: Upstreams) -> None:
    client = sdk(gateway)
    reply = Reply(
        content="Let me read it.",
        reasoning_content="The user wants the README.",
        tool_calls=[
            {"name": "read_file", "arguments": '{"path": "README.md"}', "id": "call_readme"}
        ],
    )
    upstreams.llama.queue(reply)
    whole = client.messages.create(model="local", max_tokens=300, messages=ASK, tools=TOOLS)
    upstreams.llama.reset_cache()  # the same usage for the same prompt
    upstreams.llama.queue(reply)
    final, kinds = streamed(client, model="local", max_tokens=300, messages=ASK, tools=TOOLS)
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"thinking", "signature", "text", "input_json"} <= set(kinds)
    # the stream helper's blocks carry its own parsed_output besides
    assert Message.model_validate(final.to_dict(), strict=True).model_dump(exclude={"id"}) == (
        whole.model_dump(exclude={"id"})
    )
    assert final.stop_reason == "tool_use"
    assert final.content[2].input == {"path": "README.md"}  # type: ignore[union-attr]
    assert [c["stream"] for c in gateway.calls()] == [False, True]


def test_create_with_stream_gives_the_sdks_typed_events(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(Reply(content="Streaming works fine here."))
    events = list(
        sdk(gateway).messages.create(model="local", max_tokens=100, messages=ASK, stream=True)
    )
    assert [type(e).__name__ for e in events] == [
        "RawMessageStartEvent",
        "RawContentBlockStartEvent",
        *["RawContentBlockDeltaEvent"] * (len(events) - 5),
        "RawContentBlockStopEvent",
        "RawMessageDeltaEvent",
        "RawMessageStopEvent",
    ]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")  # type: ignore[union-attr]
    assert text == "Streaming works fine here."
    assert events[-2].usage.output_tokens > 0  # type: ignore[union-attr]


LOOP = [
    Reply(
        content="",
        reasoning_content=f"Step {i}: read the next file. " * 6,
        tool_calls=[{"name": "read_file", "arguments": f'{{"path": "f{i}.py"}}'}],
    )
    for i in range(4)
] + [Reply(content="All four files are fine.", reasoning_content="Done reading. " * 5)]


def run_loop(gw: Gateway, task: str, give_back: Any) -> list[Message]:
    """Five turns as Claude Code runs them, streamed; ``give_back`` makes the assistant
    turn the caller sends back from the answer's blocks."""
    client = sdk(gw, task=task)
    history: list[Any] = [{"role": "user", "content": "Read f0.py to f3.py."}]
    answers = []
    for _ in LOOP:
        final, _ = streamed(
            client,
            model="local",
            max_tokens=1000,
            system="You read files.",
            tools=TOOLS,
            messages=history,
        )
        answers.append(final)
        history.append(
            {"role": "assistant", "content": give_back([b.to_dict() for b in final.content])}
        )
        uses = [b for b in final.content if b.type == "tool_use"]
        if uses:
            history.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": u.id,
                            "content": f"contents of {u.input['path']}",
                        }
                        for u in uses
                    ],
                }
            )
    return answers


def _sent_reasoning(upstreams: Upstreams) -> list[list[str | None]]:
    bodies = [r.body for r in upstreams.llama.requests if r.path == "/v1/chat/completions"]
    return [
        [m.get("reasoning_content") for m in b["messages"] if m["role"] == "assistant"]
        for b in bodies
    ]


@pytest.mark.parametrize(
    "give_back",
    [
        pytest.param(lambda blocks: blocks, id="thinking-given-back"),
        pytest.param(
            lambda blocks: [b for b in blocks if b["type"] != "thinking"], id="thinking-dropped"
        ),
        pytest.param(
            lambda blocks: [
                {**b, "thinking": "forged"} if b["type"] == "thinking" else b for b in blocks
            ],
            id="thinking-altered",
        ),
    ],
)
def test_a_tool_loop_gives_the_model_its_own_reasoning_back(
    gateway: Gateway, upstreams: Upstreams, give_back: Any
) -> None:
    upstreams.llama.queue(*LOOP)
    answers = run_loop(gateway, "loop", give_back)
    assert [a.stop_reason for a in answers] == ["tool_use"] * 4 + ["end_turn"]
    assert answers[-1].content[-1].text == "All four files are fine."  # type: ignore[union-attr]
    # each earlier turn went back with what the model wrote, whatever the caller did with it
    expected = [r.reasoning_content for r in LOOP]
    assert _sent_reasoning(upstreams) == [expected[:i] for i in range(5)]
    calls = [c for c in gateway.calls() if c["task"] == "loop"]
    assert len(calls) == 5 and all(c["front"] == "messages" for c in calls)
    # so every turn after the first reads the conversation from the server's cache
    assert all(c["evaluated_tokens"] < 40 for c in calls[1:]), calls
    # and the caller is told so: Anthropic's input is the part not read from a cache
    for answer, call in zip(answers, calls, strict=True):
        assert answer.usage.cache_read_input_tokens == call["cached_tokens"]
        assert answer.usage.input_tokens == call["prompt_tokens"] - call["cached_tokens"]
    assert answers[-1].usage.cache_read_input_tokens > 100  # type: ignore[operator]


def test_errors_have_anthropics_shape_and_status(gateway: Gateway, upstreams: Upstreams) -> None:
    client = sdk(gateway)
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="nope", max_tokens=10, messages=ASK)
    assert missing.value.body == {
        "type": "error",
        "error": {"type": "not_found_error", "message": "model: nope"},
        "request_id": missing.value.response.headers["request-id"],
    }
    assert missing.value.request_id == missing.value.body["request_id"]
    upstreams.llama.queue(Reply(status=429))
    with pytest.raises(anthropic.RateLimitError) as limited:
        client.messages.create(model="local", max_tokens=10, messages=ASK)
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    upstreams.llama.queue(
        Reply(
            status=503,
            error_body={
                "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
            },
        )
    )
    with pytest.raises(anthropic.OverloadedError) as overloaded:
        client.messages.create(model="local", max_tokens=10, messages=ASK)
    assert overloaded.value.status_code == 529
    assert overloaded.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="local", max_tokens=10, messages=ASK, extra_body={"frequency_penalty": 1}
        )
    assert bad.value.body["error"] == {  # type: ignore[index]
        "type": "invalid_request_error",
        "message": "frequency_penalty: Extra inputs are not permitted",
    }
    refused = [c for c in gateway.calls() if c["status"] != "ok"]
    assert {c["front"] for c in refused} == {"messages"} and len(refused) == 4


def test_a_prompt_longer_than_the_context_is_prompt_is_too_long(gateway: Gateway) -> None:
    long = "word " * 5000
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk(gateway).messages.create(
            model="local", max_tokens=10, messages=[{"role": "user", "content": long}]
        )
    error = caught.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long: ") and error["message"].endswith(
        " tokens > 4096 maximum"
    )
    assert int(error["message"].split()[4]) > 4096


def test_requests_the_front_refuses(http: httpx.Client, gateway: Gateway) -> None:
    body = {"model": "local", "max_tokens": 10, "messages": ASK}
    cases = [
        ({}, body, "anthropic-version: header is required"),
        (
            {"anthropic-version": "2022-01-01"},
            body,
            'anthropic-version: "2022-01-01" is not a valid version',
        ),
        (NEWEST, {**body, "temperature": 1.0}, "temperature: Extra inputs are not permitted"),
        (
            NEWEST,
            {
                **body,
                "messages": [
                    *ASK,
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "document",
                                "source": {"type": "text", "media_type": "text/plain", "data": "x"},
                            }
                        ],
                    },
                ],
            },
            "messages.1.content.0: Input tag 'document' found using 'type' does not match",
        ),
        (
            VERSION,
            {k: v for k, v in body.items() if k != "max_tokens"},
            "max_tokens: Field required",
        ),
        (
            {**VERSION, "X-BoundedCode-Stream-Discard": "1"},
            body,
            "X-BoundedCode-Stream-Discard: the discard event",
        ),
    ]
    for headers, sent, message in cases:
        resp = http.post("/v1/messages", json=sent, headers=headers)
        assert resp.status_code == 400, resp.text
        got = resp.json()
        assert set(got) == {"type", "error", "request_id"} and got["type"] == "error"
        assert resp.headers["request-id"] == got["request_id"]
        assert got["error"]["type"] == "invalid_request_error"
        assert got["error"]["message"].startswith(message), got
    resp = http.get("/v1/messages", headers=VERSION)
    assert resp.status_code == 405 and resp.json()["error"]["type"] == "invalid_request_error"
    resp = http.post(
        "/v1/messages",
        content=b"{not json",
        headers={**VERSION, "content-type": "application/json"},
    )
    assert resp.status_code == 400 and resp.json()["type"] == "error"


def test_an_error_inside_the_stream_is_an_error_event(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(
        Reply(
            content="A long answer that fails.",
            error_event_after_chunks=6,
            error_event={"error": {"code": 500, "message": "slot crashed", "type": "server_error"}},
        )
    )
    seen = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        for event in sdk(gateway).messages.create(
            model="local", max_tokens=100, messages=ASK, stream=True
        ):
            seen.append(event.type)
    assert (
        seen[0] == "message_start" and "content_block_delta" in seen and "message_stop" not in seen
    )
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "slot crashed"},
    }
    assert gateway.calls()[-1]["status"] == "error"


def test_the_task_in_the_path(gateway: Gateway, upstreams: Upstreams) -> None:
    client = sdk(gateway, base="/tasks/t-7")
    client.messages.create(model="local", max_tokens=10, messages=ASK)
    assert gateway.calls()[-1]["task"] == "t-7"


def test_count_tokens_is_the_prompt_the_server_reads(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    client = sdk(gateway)
    params: dict[str, Any] = {
        "model": "local",
        "system": "x-anthropic-billing-header: cch=12345;\nYou read files.",
        "messages": ASK,
        "tools": TOOLS,
    }
    counted = client.messages.count_tokens(**params)
    paths = [r.path for r in upstreams.llama.cache_requests]
    assert paths[-2:] == ["/apply-template", "/tokenize"]
    # the prompt as a call renders it: the volatile line is not in it
    assert upstreams.llama.cache_requests[-2].body["messages"][0] == {
        "role": "system",
        "content": "You read files.",
    }
    upstreams.llama.queue(Reply(content="ok"))
    message = client.messages.create(max_tokens=10, **params)
    assert counted.input_tokens == message.usage.input_tokens + (
        message.usage.cache_read_input_tokens or 0
    )
    assert counted.input_tokens > 20
    # the count is recorded as one, not as a model call: nothing generated, nothing spent
    count, call = gateway.calls()
    assert (count["purpose"], count["front"], count["status"]) == ("token_count", "messages", "ok")
    assert (count["http_status"], count["attempts"], count["model_profile"]) == (200, 1, "local")
    assert count["prompt_tokens"] is None and count["cost_usd"] is None
    assert count["completion_tokens"] is None and count["messages"] == 2
    assert call["purpose"] == "agent_turn"
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.count_tokens(model="gpt", messages=ASK)
    assert refused.value.status_code == 501
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert refused.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    assert "only a profile served by llama.cpp" in refused.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nope", messages=ASK)


CALLER_KEY = new_key()
OTHER_KEY = new_key()


@pytest.fixture
def secured(upstreams: Upstreams, start_gateway: GatewayFactory) -> Gateway:
    keys = [
        {"name": "cc", "sha256": key_digest(CALLER_KEY), "models": ["local"]},
        {"name": "other", "sha256": key_digest(OTHER_KEY), "models": ["gpt"]},
    ]
    return start_gateway(upstreams.profiles, auth={"keys": keys}, max_body_mib=0.01)


def test_keys_as_anthropics_sdk_sends_them(secured: Gateway, upstreams: Upstreams) -> None:
    upstreams.llama.queue(Reply(content="ok"))
    # the SDK's 2.x majors send api_key and auth_token alike as Authorization: Bearer
    assert (
        sdk(secured, api_key=CALLER_KEY)
        .messages.create(model="local", max_tokens=50, messages=ASK)
        .content
    )
    upstreams.llama.queue(Reply(content="ok"))
    bearer = sdk(secured, api_key=None, auth_token=CALLER_KEY)
    assert bearer.messages.create(model="local", max_tokens=50, messages=ASK).content
    assert secured.calls()[-1]["caller"] == "cc"
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        sdk(secured, api_key="sk-wrong").messages.create(model="local", max_tokens=50, messages=ASK)
    assert wrong.value.body["error"] == {  # type: ignore[index]
        "type": "authentication_error",
        "message": "invalid x-api-key",
    }
    with pytest.raises(anthropic.PermissionDeniedError) as denied:
        sdk(secured, api_key=OTHER_KEY).messages.create(model="local", max_tokens=50, messages=ASK)
    assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
    with pytest.raises(anthropic.APIStatusError) as large:
        sdk(secured, api_key=CALLER_KEY).messages.create(
            model="local", max_tokens=50, messages=[{"role": "user", "content": "x" * 20_000}]
        )
    assert large.value.status_code == 413
    assert large.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
    with httpx.Client(base_url=secured.url) as http:
        body = {"model": "local", "max_tokens": 50, "messages": ASK}
        # both given: x-api-key wins, as Anthropic's API has it
        upstreams.llama.queue(Reply(content="ok"))
        both = {**VERSION, "x-api-key": CALLER_KEY, "authorization": "Bearer sk-wrong"}
        assert http.post("/v1/messages", json=body, headers=both).status_code == 200
        both = {**VERSION, "x-api-key": "sk-wrong", "authorization": f"Bearer {CALLER_KEY}"}
        assert http.post("/v1/messages", json=body, headers=both).status_code == 401
        # x-api-key alone, as the SDKs before 2.x and Claude Code's ANTHROPIC_API_KEY send it
        upstreams.llama.queue(Reply(content="ok"))
        alone = {**VERSION, "x-api-key": CALLER_KEY}
        assert http.post("/v1/messages", json=body, headers=alone).status_code == 200
        # a chat-completions caller still sends its key as Authorization only
        resp = http.post(
            "/v1/chat/completions",
            json={"model": "local", "messages": ASK},
            headers={"x-api-key": CALLER_KEY},
        )
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"


def test_the_newest_sdks_default_client(gateway: Gateway, upstreams: Upstreams) -> None:
    """``anthropic`` 2.x as ``pip install anthropic`` gives it: 2026-10-21, the key as
    Bearer, and no sampling parameters."""
    client = sdk(gateway)
    assert client.default_headers["anthropic-version"] == "2026-10-21"
    assert client.auth_headers == {"Authorization": "Bearer unused"}
    upstreams.llama.queue(Reply(content="It describes the gateway."))
    message = client.messages.create(model="local", max_tokens=50, messages=ASK)
    assert message.content[-1].text == "It describes the gateway."  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(model="local", max_tokens=50, messages=ASK, extra_body={"top_k": 40})
    assert refused.value.body["error"]["message"] == "top_k: Extra inputs are not permitted"  # type: ignore[index]
    assert gateway.calls()[-1]["error_code"] == "unsupported_field"


def test_the_sampling_parameters_of_2023_06_01_reach_the_model(
    gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(Reply(content="ok"))
    client = sdk(gateway, version="2023-06-01")
    client.messages.create(
        model="local",
        max_tokens=50,
        messages=ASK,
        extra_body={"temperature": 0.2, "top_p": 0.9, "top_k": 40},
    )
    sent = upstreams.llama.requests.last.body
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.2, 0.9, 40)


def test_a_newer_version_is_served_by_the_newest_rules_and_noted(
    http: httpx.Client, gateway: Gateway, upstreams: Upstreams
) -> None:
    upstreams.llama.queue(Reply(content="ok"))
    body = {"model": "local", "max_tokens": 10, "messages": ASK}
    resp = http.post("/v1/messages", json=body, headers={"anthropic-version": "2027-03-01"})
    assert resp.status_code == 200, resp.text
    assert gateway.calls()[-1]["adjustments"]["anthropic_version_served_as"] == (
        "2027-03-01→2026-10-21"
    )
    resp = http.post(
        "/v1/messages",
        json={**body, "temperature": 1},
        headers={"anthropic-version": "2027-03-01"},
    )
    assert resp.status_code == 400


CLAUDE_CODE_TOOLS: list[Any] = [
    {**TOOLS[0], "defer_loading": True, "eager_input_streaming": True},
    {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"},
    {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
]


def test_claude_codes_tool_search_and_server_tools(gateway: Gateway, upstreams: Upstreams) -> None:
    """Deferred tools are loaded; the tool search tool and web search are left out with
    a note, unless tool_choice names one."""
    upstreams.llama.queue(Reply(content="ok"))
    client = sdk(gateway)
    client.messages.create(model="local", max_tokens=50, messages=ASK, tools=CLAUDE_CODE_TOOLS)
    sent = upstreams.llama.requests.last.body
    assert [t["function"]["name"] for t in sent["tools"]] == ["read_file"]
    notes = gateway.calls()[-1]["adjustments"]
    assert notes["server_tools_dropped"] == [
        "tool_search_tool_regex (tool_search_tool_regex_20251119)",
        "web_search (web_search_20250305)",
    ]
    assert notes["deferred_tools_loaded"] == 1
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model="local",
            max_tokens=50,
            messages=ASK,
            tools=CLAUDE_CODE_TOOLS,
            tool_choice={"type": "tool", "name": "web_search"},
        )
    assert refused.value.body["error"]["message"].startswith(  # type: ignore[index]
        "tool_choice.name: forcing the server tool 'web_search'"
    )


MID_SYSTEM: list[Any] = [
    {"role": "user", "content": "What is in README.md?"},
    {"role": "assistant", "content": "It describes the gateway."},
    {"role": "system", "content": "Answer in French from now on."},
    {"role": "user", "content": "And docs/?"},
]


def test_a_system_message_mid_conversation_stays_in_place(
    gateway: Gateway, upstreams: Upstreams, http: httpx.Client
) -> None:
    """A template that takes system messages anywhere gets it where it came, with or
    without Claude Code's beta header."""
    for betas in ({"anthropic-beta": "mid-conversation-system-2026-04-07"}, {}):
        upstreams.llama.queue(Reply(content="Des documents."))
        client = sdk(gateway, default_headers=betas)
        client.messages.create(model="local", max_tokens=50, messages=MID_SYSTEM)
        sent = upstreams.llama.requests.last.body
        assert sent["messages"][2] == {"role": "system", "content": "Answer in French from now on."}
    caps = http.get("/v1/models/local").json()["capabilities"]
    assert caps["system_messages"] == "in_place"


def test_where_the_template_takes_one_system_message_it_is_folded_and_the_cache_kept(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    """Turn N+1's prompt starts with turn N's whole prompt: the fold changes nothing of
    what came before, and the server's cache matches it all."""
    upstreams.llama.system_anywhere = False
    gw = start_gateway(upstreams.profiles)
    client = sdk(gw, task="fold")
    answers = ["It describes the gateway.", "Des documents.", "Voilà."]
    upstreams.llama.queue(*(Reply(content=a) for a in answers))
    turn: list[Any] = [MID_SYSTEM[0]]
    client.messages.create(model="local", max_tokens=50, messages=turn)
    # the system message comes with the second turn, the third follows it
    for ask in (MID_SYSTEM[2:], [{"role": "user", "content": "Merci."}]):
        answered = {"role": "assistant", "content": answers[(len(turn) - 1) // 2]}
        turn = [*turn, answered, *ask]
        client.messages.create(model="local", max_tokens=50, messages=turn)
    prompts = upstreams.llama.prompts[-3:]
    for earlier, later in itertools.pairwise(prompts):
        assert later.startswith(earlier.removesuffix("<|im_start|>assistant\n"))
    assert "<system-message>\nAnswer in French from now on.\n</system-message>" in prompts[1]
    calls = gw.calls()[-3:]
    assert [c["adjustments"].get("system_messages_folded") for c in calls] == [None, 1, 1]
    assert [c["miss_cause"] for c in calls[1:]] == ["none", "none"]
    assert all(c["cached_tokens"] > 0 for c in calls[1:])
    # counted as a call renders it: folded too
    assert client.messages.count_tokens(model="local", messages=turn).input_tokens > 0
    with httpx.Client(base_url=gw.url) as http:
        caps = http.get("/v1/models/local").json()["capabilities"]
    assert caps["system_messages"] == "folded"


@pytest.mark.parametrize(
    "signature",
    [
        pytest.param("bcg2.\u00e9t\u00e9", id="latin-1"),
        pytest.param("\u043a\u043b\u044e\u0447", id="cyrillic"),
        pytest.param("bcg2.\u202eevil", id="bidi-override"),
        pytest.param("bcg2." + "\U0001f600" * 2000, id="long-emoji"),
    ],
)
def test_a_signature_outside_ascii_is_an_unverified_block(
    http: httpx.Client, gateway: Gateway, upstreams: Upstreams, signature: str
) -> None:
    """A thinking block whose signature the gateway cannot have made, whatever its
    characters, is dropped as a foreign one is: the call is answered and recorded."""
    upstreams.llama.queue(Reply(content="ok"))
    thinking = {
        "type": "thinking",
        "thinking": "I will read it, \u00e9l\u00e8ve.",
        "signature": signature,
    }
    body = {
        "model": "local",
        "max_tokens": 50,
        "messages": [
            *ASK,
            {"role": "assistant", "content": [thinking, {"type": "text", "text": "Done."}]},
            {"role": "user", "content": "And now?"},
        ],
    }
    resp = http.post("/tasks/odd-signature/v1/messages", json=body, headers=VERSION)
    assert resp.status_code == 200, resp.text
    assert resp.json()["content"] == [{"type": "text", "text": "ok"}], resp.text
    # nothing of the block reached the model: it is not the gateway's
    assert _sent_reasoning(upstreams) == [[None]]
    (call,) = gateway.calls()
    assert (call["task"], call["status"], call["http_status"]) == ("odd-signature", "ok", 200)


SECRET_ENV = "TEST_MESSAGES_TOKEN_SECRET"
TOKEN_SECRET = "the-token-secret-of-the-messages-tests-0123"


def tokenizing(upstreams: Upstreams) -> int:
    """How many prompts the local server was asked to tokenize so far."""
    return [r.path for r in upstreams.llama.cache_requests].count("/tokenize")


def test_count_tokens_is_held_to_the_calls_task_scope_and_budget(
    upstreams: Upstreams, start_gateway: GatewayFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A count is refused where the call itself would be: another task than its token's
    (403), a budget spent (429); and it is recorded under the token's task either way."""
    monkeypatch.setenv(SECRET_ENV, TOKEN_SECRET)
    gw = start_gateway(upstreams.profiles, auth={"token_secret_env": SECRET_ENV})
    token = mint_task_token(TOKEN_SECRET, task="t-a", models=["local"], ttl_s=600)
    spent = mint_task_token(TOKEN_SECRET, task="t-a", models=["local"], ttl_s=600, budget_tokens=10)
    params: dict[str, Any] = {"model": "local", "messages": ASK}
    own = sdk(gw, base="/tasks/t-a", api_key=None, auth_token=token)
    assert own.messages.count_tokens(**params).input_tokens > 0
    tokenized = tokenizing(upstreams)
    other = sdk(gw, base="/tasks/t-b", api_key=None, auth_token=token)
    with pytest.raises(anthropic.PermissionDeniedError) as mismatch:
        other.messages.count_tokens(**params)
    assert "'t-a'" in mismatch.value.body["error"]["message"]  # type: ignore[index]
    # as the call itself is
    with pytest.raises(anthropic.PermissionDeniedError):
        other.messages.create(max_tokens=10, **params)
    assert tokenizing(upstreams) == tokenized  # the refused count reached no server
    # a budget spent by a call refuses the count that follows: a call without max_tokens
    # (a Messages call always has one, and one whose prompt and cap do not fit in the
    # 10 tokens left would be refused before it spent them)
    upstreams.llama.queue(Reply(content="ok"))
    spender = sdk(gw, api_key=None, auth_token=spent)
    answer = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "local", "messages": ASK},
        headers={"Authorization": f"Bearer {spent}"},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    gw.settle()
    tokenized = tokenizing(upstreams)
    with pytest.raises(anthropic.RateLimitError) as over:
        spender.messages.count_tokens(**params)
    assert "Budget exceeded" in over.value.body["error"]["message"]  # type: ignore[index]
    assert over.value.response.headers["x-should-retry"] == "false"
    assert tokenizing(upstreams) == tokenized
    records = [(c["task"], c["purpose"], c["http_status"], c["error_code"]) for c in gw.calls()]
    assert records == [
        ("t-a", "token_count", 200, None),
        ("t-a", "token_count", 403, "task_mismatch"),
        ("t-a", "agent_turn", 403, "task_mismatch"),
        ("t-a", "agent_turn", 200, None),
        ("t-a", "token_count", 429, "budget_exceeded"),
    ]
    # and a count spends nothing: the token's budget is what the call alone spent
    count_rows = [r for r in gw.ledger_rows() if r["purpose"] == "token_count"]
    assert all(r["prompt_tokens"] is None and r["cost_usd"] is None for r in count_rows)
