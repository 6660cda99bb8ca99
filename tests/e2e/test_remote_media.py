"""A media part whose source is a URL is refused for a local profile before anything is
sent: llama-server would download it from the gateway's host (into the host's network,
or out of a sandbox that has none). ``remote_media: pass`` lets it through; inline data
always goes. Audio and video are held to the model's modalities as images are to vision.

The fake llama-server downloads a part's ``http`` source as the real one does, and the
"remote" host is a web server on 127.0.0.1 that writes down every request it gets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.e2e.conftest import Gateway, GatewayFactory, Upstreams
from tests.fakes.llama_server import FakeLlamaServer
from tests.fakes.media_host import MediaHost
from tests.fakes.server import RunningServer, serve_in_thread

INLINE_PNG = "data:image/png;base64,iVBORw0KGgo="
# bare base64, as OpenAI's input_audio.data holds it ("RIFF....WAVE")
INLINE_WAV = "UklGRiQAAABXQVZF"


@pytest.fixture
def host() -> Iterator[tuple[MediaHost, RunningServer]]:
    media = MediaHost()
    with serve_in_thread(media.app) as server:
        yield media, server


def _image(url: str) -> list[Any]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": url}},
            ],
        }
    ]


def _chat_requests(fake: FakeLlamaServer) -> list[Any]:
    return [r for r in fake.requests if r.path.endswith("/chat/completions")]


def _multimodal(upstreams: Upstreams) -> None:
    for fake in (upstreams.llama, upstreams.other_local):
        fake.vision = True


@pytest.mark.parametrize("model", ["local", "other"])
def test_an_image_url_to_a_local_profile_is_refused_and_fetched_by_no_one(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    host: tuple[MediaHost, RunningServer],
    model: str,
) -> None:
    media, server = host
    _multimodal(upstreams)
    gw = start_gateway(upstreams.profiles)
    fake = upstreams.llama if model == "local" else upstreams.other_local
    url = server.url + "/cat.png"
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model=model, messages=_image(url))
    error = info.value
    assert error.code == "remote_media_refused"
    assert error.param == "messages[0].content[1].image_url.url"
    assert error.message.removeprefix("Error code: 400 - ").startswith(
        "Invalid 'messages[0].content[1].image_url.url': expected a base64-encoded data URL"
    )
    assert url in error.message and "remote_media" in error.message
    assert _chat_requests(fake) == [] and fake.media_fetches == [] and media.paths == []
    # recorded as a 400 of its own code, before any attempt
    record = gw.calls()[-1]
    assert (record["http_status"], record["error_code"]) == (400, "remote_media_refused")
    assert record["status"] == "error" and record["model_profile"] == model
    # inline data goes as before
    gw.client().chat.completions.create(model=model, messages=_image(INLINE_PNG))
    assert _chat_requests(fake)[-1].body["messages"][0]["content"][1]["image_url"]["url"] == (
        INLINE_PNG
    )
    assert media.paths == []


@pytest.mark.parametrize(
    "url",
    [
        "https://example.invalid/cat.png",
        "HTTP://example.invalid/cat.png",
        "httpAAAA",  # base64 letters, but llama-server downloads anything that begins "http"
        "file:///etc/passwd",
        "ftp://example.invalid/cat.png",
        "//example.invalid/cat.png",
    ],
)
def test_every_source_that_is_not_inline_is_refused(
    upstreams: Upstreams, start_gateway: GatewayFactory, url: str
) -> None:
    _multimodal(upstreams)
    gw = start_gateway(upstreams.profiles)
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model="local", messages=_image(url))
    assert info.value.code == "remote_media_refused"
    assert _chat_requests(upstreams.llama) == []


def test_messages_image_with_a_url_source_is_refused_in_anthropic_words(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    host: tuple[MediaHost, RunningServer],
) -> None:
    media, server = host
    _multimodal(upstreams)
    gw = start_gateway(upstreams.profiles)
    url = server.url + "/cat.png"
    image = {"type": "image", "source": {"type": "url", "url": url}}
    messages: Any = [{"role": "user", "content": [{"type": "text", "text": "what"}, image]}]
    client = anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)
    try:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model="local", max_tokens=10, messages=messages)
        body: Any = info.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
        assert message.startswith("source.type: a source of type 'url' is not supported")
        assert "type 'base64'" in message and url in message
        # the token count renders the media as a call does: refused the same way
        with pytest.raises(anthropic.BadRequestError):
            client.messages.count_tokens(model="local", messages=messages)
    finally:
        client.close()
    assert _chat_requests(upstreams.llama) == []
    assert [r for r in upstreams.llama.cache_requests if url in str(r.body)] == []
    assert upstreams.llama.media_fetches == [] and media.paths == []
    call, count = gw.calls()[-2:]
    assert (call["front"], call["http_status"], call["error_code"]) == (
        "messages",
        400,
        "remote_media_refused",
    )
    assert (count["purpose"], count["error_code"]) == ("token_count", "remote_media_refused")


def test_responses_input_image_with_a_url_is_refused(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    host: tuple[MediaHost, RunningServer],
) -> None:
    media, server = host
    _multimodal(upstreams)
    gw = start_gateway(upstreams.profiles)
    part = {"type": "input_image", "image_url": server.url + "/cat.png"}
    body = {"model": "local", "input": [{"role": "user", "content": [part]}]}
    answer = httpx.post(gw.url + "/v1/responses", json=body, timeout=10)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "remote_media_refused"
    assert _chat_requests(upstreams.llama) == [] and media.paths == []


def test_pass_sends_the_url_for_the_server_to_fetch(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    host: tuple[MediaHost, RunningServer],
) -> None:
    media, server = host
    _multimodal(upstreams)
    profiles = {"local": {**upstreams.profiles["local"], "remote_media": "pass"}}
    gw = start_gateway(profiles)
    url = server.url + "/cat.png"
    gw.client().chat.completions.create(model="local", messages=_image(url))
    # once, for the call: the cache keeper's follow-up renders no conversation that would
    # have the server download it again
    gw.settle()
    assert upstreams.llama.media_fetches == [url] and media.paths == ["/cat.png"]
    renders = [r for r in upstreams.llama.cache_requests if r.path == "/apply-template"]
    assert renders and not [r for r in renders if b"cat.png" in r.raw_body]
    caps = httpx.get(gw.url + "/v1/models/local", timeout=10).json()["capabilities"]
    assert caps["media_urls"] is True


def test_a_cloud_profile_gets_the_url_as_sent(gateway: Gateway, upstreams: Upstreams) -> None:
    """The provider fetches a URL from its own network: the gateway leaves it as it is."""
    messages = _image("https://example.invalid/cat.png")
    gateway.client().chat.completions.create(model="gpt", messages=messages)
    assert upstreams.openai.requests.last.body["messages"] == messages
    models = httpx.get(gateway.url + "/v1/models", timeout=10).json()["data"]
    caps = {m["id"]: m["capabilities"] for m in models}
    assert caps["gpt"]["media_urls"] is True
    assert caps["local"]["media_urls"] is False and caps["other"]["media_urls"] is False
    # the fake llama-server's /props: no audio, no video
    assert (caps["local"]["audio"], caps["local"]["video"]) == (False, False)


def _audio(source: dict[str, str]) -> list[Any]:
    part = {"type": "input_audio", "input_audio": {**source, "format": "wav"}}
    return [{"role": "user", "content": [{"type": "text", "text": "transcribe"}, part]}]


def test_audio_to_a_model_without_audio_is_refused(
    upstreams: Upstreams, start_gateway: GatewayFactory
) -> None:
    gw = start_gateway(upstreams.profiles)
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model="local", messages=_audio({"data": INLINE_WAV}))
    assert info.value.code == "capability_missing"
    assert "does not take audio (capabilities.audio is false)" in info.value.message
    assert info.value.param == "messages[0].content[1]"
    assert _chat_requests(upstreams.llama) == []
    assert gw.calls()[-1]["error_code"] == "capability_missing"


def test_audio_inline_goes_and_from_a_url_is_refused(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    host: tuple[MediaHost, RunningServer],
) -> None:
    media, server = host
    upstreams.llama.audio = True
    gw = start_gateway(upstreams.profiles)
    caps = httpx.get(gw.url + "/v1/models/local", timeout=10).json()["capabilities"]
    assert caps["audio"] is True and caps["video"] is False
    gw.client().chat.completions.create(model="local", messages=_audio({"data": INLINE_WAV}))
    assert len(_chat_requests(upstreams.llama)) == 1
    for source in ({"data": server.url + "/a.wav"}, {"url": server.url + "/a.wav"}):
        with pytest.raises(openai.BadRequestError) as info:
            gw.client().chat.completions.create(model="local", messages=_audio(source))
        assert info.value.code == "remote_media_refused"
        assert info.value.param == f"messages[0].content[1].input_audio.{next(iter(source))}"
    assert len(_chat_requests(upstreams.llama)) == 1 and media.paths == []


@pytest.mark.parametrize("part_type", ["input_video", "video_url"])
def test_video_to_a_model_without_video_is_refused(
    upstreams: Upstreams, start_gateway: GatewayFactory, part_type: str
) -> None:
    gw = start_gateway(upstreams.profiles)
    part = {"type": part_type, part_type: {"url": "data:video/mp4;base64,AAAAIGZ0eXA="}}
    messages: Any = [{"role": "user", "content": [part]}]
    with pytest.raises(openai.BadRequestError) as info:
        gw.client().chat.completions.create(model="local", messages=messages)
    assert info.value.code == "capability_missing" and "does not take video" in info.value.message
    assert _chat_requests(upstreams.llama) == []


def test_an_image_by_url_in_a_tool_result_is_refused(
    upstreams: Upstreams,
    start_gateway: GatewayFactory,
    host: tuple[MediaHost, RunningServer],
) -> None:
    """A tool's screenshot by URL is a part of a tool message: held to the same rule."""
    media, server = host
    _multimodal(upstreams)
    gw = start_gateway(upstreams.profiles)
    image = {"type": "image", "source": {"type": "url", "url": server.url + "/shot.png"}}
    use = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image]}
    messages: Any = [
        {"role": "user", "content": "look"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    answer = httpx.post(
        gw.url + "/v1/messages",
        json={"model": "local", "max_tokens": 10, "messages": messages},
        headers={"anthropic-version": "2023-06-01"},
        timeout=10,
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["message"].startswith("source.type:")
    assert _chat_requests(upstreams.llama) == [] and media.paths == []
