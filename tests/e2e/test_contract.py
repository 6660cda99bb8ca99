"""The failure table of docs/failures.md as one contract, over every provider kind.

Each row scripts the upstream with the shared ``Reply`` vocabulary, which each fake renders
in its own provider's wire shape, and states what the caller sees and what the record (call
log and ledger) says. Where a kind legitimately behaves otherwise — llama.cpp goes on with a
text answer that broke, local servers resend only their 500s, Gemini's first chunk already
holds content — that is a column of the kind's row below, never a skipped test.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import yaml

from boundedcode_gateway.app import create_app
from boundedcode_gateway.config import parse_config
from boundedcode_gateway.ingress.server import GatheringHttpToolsProtocol
from tests.e2e.conftest import Gateway
from tests.e2e.every_kind import AWARE, Fakes, fakes
from tests.fakes.common import Reply, parse_sse
from tests.fakes.server import serve_in_thread
from tests.outcomes import outcomes

__all__ = ["fakes"]  # the module-scoped fixture

ANSWER = "one two three four five six seven eight nine ten eleven twelve"
ASK: list[Any] = [{"role": "user", "content": "count to twelve"}]
BROKEN = {"status": 502, "code": "upstream_stream_broken"}
ANSWERED = {"status": 200, "code": None}
# the impatient gateway's read timeout: a scripted silence outlasts it (it lasts until the
# gateway hangs up), while a fake streaming on a busy machine stays well inside it
READ_TIMEOUT_S = 0.5
# the content chunks shown before a break or error "after content"
SHOWN = 3
# a cloud's statuses worth resending (docs/failures.md, "Cloud 429, 5xx, 529")
CLOUD_RESENDS = frozenset({429, 500, 502, 503, 504, 529})
# the bounded gateway's limits: an answer or a stream event past 1 MiB, a call past 2 s
LIMIT_MIB = 1
MAX_CALL_S = 2.0
# one word of the answer past the limit: the fakes send a word in one event
HUGE_WORD = "a" * ((LIMIT_MIB << 20) + 1024)
TOO_LARGE = {"status": 502, "code": "upstream_response_too_large"}
TIMED_OUT = {"status": 504, "code": "upstream_timeout"}


@dataclass(frozen=True)
class Kind:
    """One provider kind, and where the contract differs for it."""

    profile: str
    # the attribute of ``Fakes`` holding its fake
    fake: str
    # chunks of a streamed answer that show nothing yet (llama.cpp's prompt progress, a role
    # chunk, Anthropic's message_start, ping and content_block_start; none for Gemini)
    before_content: int
    # the statuses of this suite the kind sends again (a local server only its 500s)
    resends: frozenset[int]
    # a status the kind resends when an error event says it (its overload)
    overload: int
    # llama.cpp goes on with a text answer where it broke, once, instead of answering again
    continues_text: bool = False


KINDS = [
    Kind("local", "llama", 3, frozenset({500}), 500, continues_text=True),
    Kind("other", "other", 1, frozenset({500}), 500),
    Kind("gpt", "openai", 1, CLOUD_RESENDS, 503),
    Kind("glm", "compat", 1, CLOUD_RESENDS, 503),
    Kind("claude", "claude", 3, CLOUD_RESENDS, 529),
    Kind("gem", "gemini", 0, frozenset({429, 500, 503, 504}), 503),
]


@dataclass(frozen=True)
class Break:
    """A way a stream ends with no finish: the connection dropped, or the upstream fell
    silent (which the impatient gateway's read timeout turns into a break)."""

    name: str
    after: Callable[[int], Reply]
    impatient: bool


BREAKS = [
    Break("dropped", lambda n: Reply(content=ANSWER, break_after_chunks=n), impatient=False),
    Break("silent", lambda n: Reply(content=ANSWER, silent_after_chunks=n), impatient=True),
]
# a whole answer that never arrives whole: cut short, or its body never sent
CUTS = [
    Break("cut", lambda _: Reply(content=ANSWER, cut_body=True), impatient=False),
    Break("silent", lambda _: Reply(content=ANSWER, silent_after_chunks=0), impatient=True),
]


def _start(fakes: Fakes, data_dir: Any, **settings: Any) -> Gateway:
    text = yaml.safe_dump({"data_dir": str(data_dir), **settings, "models": fakes.profiles})
    app = create_app(parse_config(text))
    server = serve_in_thread(app, lifespan="on", http=GatheringHttpToolsProtocol)
    return Gateway(app, server, data_dir)


@pytest.fixture(scope="module")
def patient(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway with the default timeouts."""
    gw = _start(fakes, tmp_path_factory.mktemp("patient"))
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def impatient(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose read timeout a silent upstream outlasts."""
    gw = _start(
        fakes, tmp_path_factory.mktemp("impatient"), inference={"read_timeout_s": READ_TIMEOUT_S}
    )
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def bounded(fakes: Fakes, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway with small upstream limits and a call deadline."""
    limits = {"max_body_mib": LIMIT_MIB, "max_event_mib": LIMIT_MIB}
    gw = _start(
        fakes,
        tmp_path_factory.mktemp("bounded"),
        inference={"upstream_limits": limits, "max_call_s": MAX_CALL_S},
    )
    yield gw
    gw.stop()


@pytest.fixture(params=KINDS, ids=[k.profile for k in KINDS])
def kind(request: pytest.FixtureRequest, fakes: Fakes) -> Kind:
    fakes.reset()
    return request.param  # type: ignore[no-any-return]


_tasks = itertools.count()


@dataclass
class Outcome:
    """What the caller got for one request, what the upstream was sent, what was recorded."""

    status: int
    headers: httpx.Headers
    raw: bytes
    sent: int
    call: dict[str, Any]
    row: dict[str, Any]

    @property
    def events(self) -> list[Any]:
        return parse_sse(self.raw)

    @property
    def json(self) -> Any:
        return httpx.Response(self.status, content=self.raw).json()

    def chunks(self) -> list[dict[str, Any]]:
        return [e for e in self.events if isinstance(e, dict)]

    def discards(self) -> list[int]:
        """Where the discard events are, by position among the events."""
        return [
            i
            for i, e in enumerate(self.events)
            if isinstance(e, dict) and e.get("boundedcode", {}).get("event") == "discard"
        ]

    def text(self, events: list[Any] | None = None) -> str:
        """The content the chunks carry (of ``events``, else of the whole stream)."""
        return "".join(
            e["choices"][0]["delta"].get("content") or ""
            for e in (self.events if events is None else events)
            if isinstance(e, dict) and e.get("choices")
        )

    def whole_text(self) -> str:
        return str(self.json["choices"][0]["message"]["content"])

    def recorded(
        self,
        *,
        ok: bool,
        http_status: int,
        attempts: int,
        retried: bool,
        attempt_log: list[dict[str, Any]] | None = None,
    ) -> None:
        """The call log line and the ledger row say the same, and this."""
        call, row = self.call, self.row
        assert call["status"] == ("ok" if ok else "error"), call
        assert call["http_status"] == http_status, call
        assert call["attempts"] == attempts, call
        assert call["retried"] is retried, call
        if attempt_log is not None:
            assert outcomes(call["attempt_log"]) == attempt_log, call
        assert len(call["attempt_log"]) == attempts, call
        for key in ("status", "http_status", "attempts", "error_code", "stream"):
            assert row[key] == call[key], (key, row, call)
        assert bool(row["retried"]) is retried

    def ends_in_stream_error(self, code: str | None = None) -> dict[str, Any]:
        """The stream ends in one in-stream error object and no ``[DONE]``; the error."""
        events = self.events
        assert self.status == 200 and "[DONE]" not in events, events[-3:]
        error = events[-1]["error"]
        assert set(error) == {"message", "type", "param", "code"}
        if code is not None:
            assert error["code"] == code
        assert not any("error" in e for e in events[:-1] if isinstance(e, dict))
        return error  # type: ignore[no-any-return]


def ask(gw: Gateway, fakes: Fakes, kind: Kind, *, stream: bool, aware: bool = False) -> Outcome:
    fake = getattr(fakes, kind.fake)
    before = _posts(fake)
    task = f"contract-{next(_tasks)}"
    headers = {"X-BoundedCode-Task": task, **(AWARE if aware else {})}
    body = {"model": kind.profile, "messages": ASK, "stream": stream}
    resp = httpx.post(gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=30)
    [call] = [c for c in gw.calls() if c["task"] == task]
    [row] = [r for r in gw.ledger_rows() if r["call_id"] == call["call_id"]]
    return Outcome(resp.status_code, resp.headers, resp.content, _posts(fake) - before, call, row)


def _posts(fake: Any) -> int:
    return len([r for r in fake.requests if r.method == "POST"])


def _queue(fakes: Fakes, kind: Kind, *replies: Reply) -> None:
    getattr(fakes, kind.fake).queue(*replies)


def _whole_answer() -> Reply:
    return Reply(content=ANSWER)


def _gateway(brk: Break, patient: Gateway, impatient: Gateway) -> Gateway:
    return impatient if brk.impatient else patient


@pytest.fixture
def gateways(patient: Gateway, impatient: Gateway) -> Callable[[Break], Gateway]:
    return lambda brk: _gateway(brk, patient, impatient)


# -- a stream breaks before any content: sent once more, silently


@pytest.mark.parametrize("brk", BREAKS, ids=[b.name for b in BREAKS])
def test_a_break_before_content_is_resent_silently(
    gateways: Callable[[Break], Gateway], fakes: Fakes, kind: Kind, brk: Break
) -> None:
    _queue(fakes, kind, brk.after(kind.before_content), _whole_answer())
    out = ask(gateways(brk), fakes, kind, stream=True)
    assert out.status == 200 and out.events[-1] == "[DONE]"
    assert out.text() == ANSWER and not out.discards()
    # the held role chunk went with the broken answer: one role, one finish
    roles = [c for c in out.chunks() if c.get("choices") and "role" in c["choices"][0]["delta"]]
    finishes = [c for c in out.chunks() if c.get("choices") and c["choices"][0]["finish_reason"]]
    assert len(roles) == 1 and len(finishes) == 1
    assert out.sent == 2
    out.recorded(ok=True, http_status=200, attempts=2, retried=True, attempt_log=[BROKEN, ANSWERED])


def test_two_breaks_before_content_are_an_http_502(
    patient: Gateway, fakes: Fakes, kind: Kind
) -> None:
    broken = Reply(content=ANSWER, break_after_chunks=kind.before_content)
    _queue(fakes, kind, broken, broken, _whole_answer())
    out = ask(patient, fakes, kind, stream=True)
    assert out.status == 502
    assert out.json["error"]["code"] == "upstream_stream_broken"
    assert out.sent == 2
    out.recorded(ok=False, http_status=502, attempts=2, retried=True, attempt_log=[BROKEN, BROKEN])


# -- a stream breaks after content: the caller decides


def _continued(out: Outcome) -> None:
    """llama.cpp went on from where it broke: one unbroken answer, whoever the caller."""
    assert out.status == 200 and out.events[-1] == "[DONE]"
    assert out.text() == ANSWER and not out.discards()
    assert out.sent == 2
    out.recorded(ok=True, http_status=200, attempts=2, retried=True, attempt_log=[BROKEN, ANSWERED])
    assert out.call["adjustments"]["continued_after_break"] is True


@pytest.mark.parametrize("brk", BREAKS, ids=[b.name for b in BREAKS])
def test_a_break_after_content_is_an_in_stream_error_for_a_caller_that_did_not_declare(
    gateways: Callable[[Break], Gateway], fakes: Fakes, kind: Kind, brk: Break
) -> None:
    _queue(fakes, kind, brk.after(kind.before_content + SHOWN), _whole_answer())
    out = ask(gateways(brk), fakes, kind, stream=True)
    if kind.continues_text:
        _continued(out)
        return
    error = out.ends_in_stream_error("upstream_stream_broken")
    assert error["type"] == "server_error" and error["param"] is None
    # a part of the one answer, never a second answer glued to it
    shown = out.text()
    assert shown and ANSWER.startswith(shown) and shown != ANSWER
    assert not out.discards()
    assert out.sent == 1
    out.recorded(ok=False, http_status=502, attempts=1, retried=False, attempt_log=[BROKEN])


@pytest.mark.parametrize("brk", BREAKS, ids=[b.name for b in BREAKS])
def test_a_break_after_content_is_discarded_and_answered_again_for_a_declaring_caller(
    gateways: Callable[[Break], Gateway], fakes: Fakes, kind: Kind, brk: Break
) -> None:
    _queue(fakes, kind, brk.after(kind.before_content + SHOWN), _whole_answer())
    out = ask(gateways(brk), fakes, kind, stream=True, aware=True)
    if kind.continues_text:
        _continued(out)
        return
    assert out.status == 200 and out.events[-1] == "[DONE]"
    [at] = out.discards()
    discard = out.events[at]
    assert discard["choices"] == [] and discard["id"] == out.call["call_id"]
    assert discard["model"] == kind.profile
    shown = out.text(out.events[:at])
    assert shown and ANSWER.startswith(shown) and shown != ANSWER
    assert out.text(out.events[at + 1 :]) == ANSWER
    assert out.sent == 2
    out.recorded(ok=True, http_status=200, attempts=2, retried=True, attempt_log=[BROKEN, ANSWERED])


@pytest.mark.parametrize("aware", [False, True], ids=["undeclared", "declaring"])
def test_an_answer_that_keeps_breaking_ends_in_the_in_stream_error(
    patient: Gateway, fakes: Fakes, kind: Kind, aware: bool
) -> None:
    broken = Reply(content=ANSWER, break_after_chunks=kind.before_content + SHOWN)
    _queue(fakes, kind, broken, broken, broken, _whole_answer())
    out = ask(patient, fakes, kind, stream=True, aware=aware)
    out.ends_in_stream_error("upstream_stream_broken")
    # the sends: the first; llama.cpp's one continuation; a resend only for a declaring
    # caller, who is told once to discard
    sends = 1 + kind.continues_text + aware
    assert len(out.discards()) == int(aware)
    assert out.sent == sends
    out.recorded(
        ok=False, http_status=502, attempts=sends, retried=sends > 1, attempt_log=[BROKEN] * sends
    )
    if kind.continues_text:
        assert out.call["adjustments"]["continued_after_break"] is False


# -- an error event inside a stream


def test_an_error_event_before_content_is_an_http_error_with_its_status(
    patient: Gateway, fakes: Fakes, kind: Kind
) -> None:
    refused = Reply(
        content=ANSWER, error_event_after_chunks=kind.before_content, error_event_status=400
    )
    _queue(fakes, kind, refused, _whole_answer())
    out = ask(patient, fakes, kind, stream=True)
    assert out.status == 400
    assert set(out.json["error"]) == {"message", "type", "param", "code"}
    assert out.json["error"]["message"]
    assert out.sent == 1
    out.recorded(ok=False, http_status=400, attempts=1, retried=False)


def test_an_error_event_before_content_with_a_resent_status_is_sent_again(
    patient: Gateway, fakes: Fakes, kind: Kind
) -> None:
    overloaded = Reply(
        content=ANSWER,
        error_event_after_chunks=kind.before_content,
        error_event_status=kind.overload,
    )
    _queue(fakes, kind, overloaded, _whole_answer())
    out = ask(patient, fakes, kind, stream=True)
    assert out.status == 200 and out.events[-1] == "[DONE]"
    assert out.text() == ANSWER
    assert out.sent == 2
    # an answer refused is not a broken answer: sent again, not "retried"
    out.recorded(ok=True, http_status=200, attempts=2, retried=False)
    assert [a["status"] for a in out.call["attempt_log"]] == [kind.overload, 200]


@pytest.mark.parametrize("aware", [False, True], ids=["undeclared", "declaring"])
def test_an_error_event_after_content_is_the_in_stream_error(
    patient: Gateway, fakes: Fakes, kind: Kind, aware: bool
) -> None:
    failing = Reply(
        content=ANSWER,
        error_event_after_chunks=kind.before_content + SHOWN,
        error_event_status=kind.overload,
    )
    _queue(fakes, kind, failing, _whole_answer())
    out = ask(patient, fakes, kind, stream=True, aware=aware)
    error = out.ends_in_stream_error()
    assert error["message"] and error["code"] != "upstream_stream_broken"
    shown = out.text()
    assert shown and ANSWER.startswith(shown) and shown != ANSWER
    # the upstream said no: nothing to discard, nothing sent again, even when resendable
    assert not out.discards()
    assert out.sent == 1
    out.recorded(ok=False, http_status=kind.overload, attempts=1, retried=False)


# -- a non-streamed body cut short


@pytest.mark.parametrize("cut", CUTS, ids=[c.name for c in CUTS])
def test_a_whole_answer_cut_short_is_sent_again(
    gateways: Callable[[Break], Gateway], fakes: Fakes, kind: Kind, cut: Break
) -> None:
    _queue(fakes, kind, cut.after(0), _whole_answer())
    out = ask(gateways(cut), fakes, kind, stream=False)
    assert out.status == 200 and out.whole_text() == ANSWER
    assert out.sent == 2
    out.recorded(ok=True, http_status=200, attempts=2, retried=True, attempt_log=[BROKEN, ANSWERED])


def test_a_whole_answer_cut_twice_is_an_http_502(
    patient: Gateway, fakes: Fakes, kind: Kind
) -> None:
    cut = Reply(content=ANSWER, cut_body=True)
    _queue(fakes, kind, cut, cut, _whole_answer())
    out = ask(patient, fakes, kind, stream=False)
    assert out.status == 502
    assert out.json["error"]["code"] == "upstream_stream_broken"
    assert out.sent == 2
    out.recorded(ok=False, http_status=502, attempts=2, retried=True, attempt_log=[BROKEN, BROKEN])


# -- an error status: resent within the budget, or the caller's


def _answered_after(out: Outcome, status: int, stream: bool) -> None:
    assert out.status == 200
    assert (out.text() if stream else out.whole_text()) == ANSWER
    assert out.sent == 2
    out.recorded(ok=True, http_status=200, attempts=2, retried=False)
    assert [a["status"] for a in out.call["attempt_log"]] == [status, 200]


def _passed_on(out: Outcome, status: int, code: str | None = None) -> None:
    assert out.status == status
    error = out.json["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    assert out.sent == 1
    out.recorded(ok=False, http_status=status, attempts=1, retried=False)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("status", [429, 500, 502, 503, 529])
def test_an_error_status_is_sent_again_where_the_kind_resends_it(
    patient: Gateway, fakes: Fakes, kind: Kind, status: int, stream: bool
) -> None:
    _queue(fakes, kind, Reply(status=status, headers={"retry-after": "0"}), _whole_answer())
    out = ask(patient, fakes, kind, stream=stream)
    if status in kind.resends:
        _answered_after(out, status, stream)
    else:
        _passed_on(out, status)
        # the caller may wait as the upstream asked
        assert out.headers["retry-after"] == "0"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_retry_after_beyond_the_budget_reaches_the_caller(
    patient: Gateway, fakes: Fakes, kind: Kind, stream: bool
) -> None:
    _queue(fakes, kind, Reply(status=429, headers={"retry-after": "120"}), _whole_answer())
    out = ask(patient, fakes, kind, stream=stream)
    _passed_on(out, 429)
    assert out.headers["retry-after"] == "120"


# -- silence: no status within the read timeout


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_silence_before_the_status_is_a_timeout(
    impatient: Gateway, fakes: Fakes, kind: Kind, stream: bool
) -> None:
    _queue(fakes, kind, Reply(silent_before_headers=True), _whole_answer())
    out = ask(impatient, fakes, kind, stream=stream)
    if 504 in kind.resends:
        _answered_after(out, 504, stream)
        assert out.call["attempt_log"][0]["code"] == "upstream_timeout"
    else:
        _passed_on(out, 504, "upstream_timeout")


# -- an answer past the upstream limits, a call past its deadline


def test_a_whole_answer_past_the_body_limit_is_a_502_not_sent_again(
    bounded: Gateway, fakes: Fakes, kind: Kind
) -> None:
    _queue(fakes, kind, Reply(content=HUGE_WORD), _whole_answer())
    out = ask(bounded, fakes, kind, stream=False)
    assert out.status == 502
    error = out.json["error"]
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_body_mib (1 MiB)" in error["message"]
    assert out.sent == 1
    out.recorded(ok=False, http_status=502, attempts=1, retried=False, attempt_log=[TOO_LARGE])


def test_a_stream_event_past_its_limit_before_content_is_an_http_502(
    bounded: Gateway, fakes: Fakes, kind: Kind
) -> None:
    _queue(fakes, kind, Reply(content=HUGE_WORD), _whole_answer())
    out = ask(bounded, fakes, kind, stream=True)
    assert out.status == 502
    error = out.json["error"]
    assert error["code"] == "upstream_response_too_large"
    assert "inference.upstream_limits.max_event_mib (1 MiB)" in error["message"]
    assert out.sent == 1
    out.recorded(ok=False, http_status=502, attempts=1, retried=False, attempt_log=[TOO_LARGE])


def test_a_stream_event_past_its_limit_after_content_is_the_in_stream_error(
    bounded: Gateway, fakes: Fakes, kind: Kind
) -> None:
    _queue(fakes, kind, Reply(content=f"{ANSWER} {HUGE_WORD}"), _whole_answer())
    out = ask(bounded, fakes, kind, stream=True)
    error = out.ends_in_stream_error("upstream_response_too_large")
    assert "max_event_mib (1 MiB)" in error["message"]
    shown = out.text()
    assert shown and shown.startswith(ANSWER[:3]) and HUGE_WORD not in shown
    assert not out.discards()
    assert out.sent == 1
    out.recorded(ok=False, http_status=502, attempts=1, retried=False, attempt_log=[TOO_LARGE])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_call_past_max_call_s_before_content_is_an_http_504(
    bounded: Gateway, fakes: Fakes, kind: Kind, stream: bool
) -> None:
    late = Reply(content=ANSWER, delay_ms=int(MAX_CALL_S * 1000) + 3000)
    _queue(fakes, kind, late, _whole_answer())
    out = ask(bounded, fakes, kind, stream=stream)
    assert out.status == 504
    error = out.json["error"]
    assert error["code"] == "upstream_timeout"
    assert f"inference.max_call_s ({MAX_CALL_S:g} s)" in error["message"]
    assert out.sent == 1
    out.recorded(ok=False, http_status=504, attempts=1, retried=False, attempt_log=[TIMED_OUT])


def test_a_stream_past_max_call_s_after_content_is_the_in_stream_error(
    bounded: Gateway, fakes: Fakes, kind: Kind
) -> None:
    slow = Reply(content=ANSWER, chunk_delay_ms=400)  # about 10 s in all
    _queue(fakes, kind, slow, _whole_answer())
    out = ask(bounded, fakes, kind, stream=True)
    error = out.ends_in_stream_error("upstream_timeout")
    assert f"inference.max_call_s ({MAX_CALL_S:g} s)" in error["message"]
    shown = out.text()
    assert shown and ANSWER.startswith(shown) and shown != ANSWER
    assert out.sent == 1
    out.recorded(ok=False, http_status=504, attempts=1, retried=False, attempt_log=[TIMED_OUT])
