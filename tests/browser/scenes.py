"""Calls made for the page to show: a conversation, a condensed workload, a slow stream."""

from __future__ import annotations

import itertools
import threading
from typing import Any

import openai
from bench.inference.caller import Caller
from bench.inference.workload import load_workload

from tests.e2e.conftest import Gateway
from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer

REASONING = "Let me look at the code first."


def converse(
    gw: Gateway, llama: FakeLlamaServer, task: str, turns: int, model: str = "local"
) -> None:
    """``turns`` calls of one task, each answer sent back without its reasoning, as a
    bounded-mode caller sends it."""
    client = gw.client(task=task)
    history: list[Any] = [{"role": "system", "content": "You are a careful coding agent."}]
    for i in range(turns):
        llama.queue(Reply(content=f"Step {i} is done.", reasoning_content=REASONING))
        history.append({"role": "user", "content": f"Now do step {i}."})
        answer = client.chat.completions.create(model=model, messages=history)
        history.append({"role": "assistant", "content": answer.choices[0].message.content})
        gw.settle()


def run_workload(gw: Gateway, name: str, model: str = "local") -> str:
    """The inference benchmark's workload ``name``, every step through the gateway; its
    task's name."""
    workload = load_workload(name)
    caller = Caller(workload)
    clients: dict[str, openai.OpenAI] = {}
    while not caller.done:
        request = caller.next_request()
        client = clients.get(request.purpose)
        if client is None:
            client = clients[request.purpose] = gw.client(request.task, request.purpose)
        answer = client.chat.completions.create(
            model=model,
            messages=request.messages,  # type: ignore[arg-type]
            tools=request.tools,  # type: ignore[arg-type]
        )
        caller.record_answer(answer.choices[0].message.model_dump(exclude_none=True))
        gw.settle()
    return workload.task


class SlowStream:
    """A streamed call in a thread whose long prompt the fake reads slowly, a progress
    chunk at a time, then answers a token at a time. Each one's prompt is new to the
    fake's cache."""

    made = itertools.count()

    def __init__(
        self,
        gw: Gateway,
        llama: FakeLlamaServer,
        prompt_words: int = 2500,
        answer_words: int = 20,
        delay_ms: int = 80,
        task: str | None = None,
    ) -> None:
        n = next(self.made)
        llama.progress_batch = 200
        llama.n_ctx = max(llama.n_ctx, 4 * prompt_words)
        llama.queue(Reply(content="tick " * answer_words, chunk_delay_ms=delay_ms))
        self._client = gw.client(task=task or f"long-read-{n}")
        word = f"word{n} "
        self._messages: Any = [{"role": "user", "content": word * prompt_words}]
        self.text = ""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="slow-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            stream = self._client.chat.completions.create(
                model="local", messages=self._messages, stream=True
            )
            for chunk in stream:
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
        except BaseException as exc:  # handed to the test by join()
            self.error = exc

    def join(self, timeout_s: float = 20.0) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the slow stream did not end"
        if self.error is not None:
            raise self.error
