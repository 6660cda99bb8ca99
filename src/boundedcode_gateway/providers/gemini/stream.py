"""The stream translator for Gemini: ``streamGenerateContent?alt=sse`` chunks to OpenAI chunks.

A pure state machine. Each ``data:`` payload is a partial ``GenerateContentResponse``;
there is no ``[DONE]``, so the answer is complete only at the chunk that carries a
``finishReason``. Usage comes from the last chunk that has it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from boundedcode_gateway.errors import MalformedResponse
from boundedcode_gateway.providers.base import PartialAnswer, RequestOptions
from boundedcode_gateway.providers.gemini.response import (
    AnswerParts,
    blocked_prompt,
    candidate_parts,
    error_in_stream,
    finish_reason,
    first_candidate,
    read_usage,
)
from boundedcode_gateway.upstream.metrics import CallMetrics, CaptureLimit
from boundedcode_gateway.wire.chat import SYSTEM_STAMPS, ChunkWriter, Stamps

_NOTHING: tuple[bytes, ...] = ()


class GeminiStreamTranslator:
    """Translates one streamed Gemini answer, keeping one id for all its chunks."""

    __slots__ = (
        "_answer",
        "_model",
        "_options",
        "_secrets",
        "_stamps",
        "_writer",
        "content_started",
        "finished",
        "metrics",
        "progress_seen",
    )

    def __init__(
        self,
        options: RequestOptions,
        model: str,
        secrets: tuple[str, ...] = (),
        stamps: Stamps = SYSTEM_STAMPS,
    ) -> None:
        self.metrics = CallMetrics()
        self.content_started = False
        self.finished = False
        self.progress_seen = False
        self._options = options
        self._model = model
        self._secrets = secrets
        self._stamps = stamps
        self._answer = AnswerParts(stamps, CaptureLimit(options.max_captured_bytes))
        self._writer: ChunkWriter | None = None

    def feed(self, event: str, data: bytes) -> Sequence[bytes]:
        """Consume one ``data:`` payload; return the OpenAI chunks it makes."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise MalformedResponse("Gemini sent a stream event that is not JSON") from None
        error = error_in_stream(obj, self._secrets)
        if error is not None:
            raise error
        # without alt=sse Gemini streams one JSON array; take its elements the same way
        responses = obj if isinstance(obj, list) else [obj]
        out: list[bytes] = []
        for response in responses:
            if not isinstance(response, dict):
                raise MalformedResponse("Gemini sent a stream event that is not an object")
            out += self._response(response)
        return out

    def shown_text(self) -> PartialAnswer | None:
        return None  # the provider cannot go on with a partial answer

    def _writer_for(self, obj: dict[str, Any]) -> ChunkWriter:
        if self._writer is None:
            self._writer = ChunkWriter(
                obj.get("responseId"), self.metrics.upstream_model or self._model, self._stamps
            )
        return self._writer

    def _response(self, obj: dict[str, Any]) -> list[bytes]:
        if "usageMetadata" in obj:
            read_usage(obj["usageMetadata"], self.metrics)
        if self.metrics.upstream_model is None and isinstance(obj.get("modelVersion"), str):
            self.metrics.upstream_model = obj["modelVersion"]
        writer = self._writer_for(obj)
        if self.finished:
            return []  # usage after the finish is metered; the caller's answer is closed
        candidate = first_candidate(obj)
        if candidate is None:
            return self._finish(writer, "content_filter") if blocked_prompt(obj) else []
        out: list[bytes] = []
        for part in candidate_parts(candidate):
            delta = self._answer.add(part)
            if delta is not None:
                self.content_started = True
                out.append(writer.delta(delta))
        reason = candidate.get("finishReason")
        if isinstance(reason, str) and reason:
            finish = finish_reason(
                reason, bool(self._answer.tool_calls), candidate.get("finishMessage")
            )
            out += self._finish(writer, finish)
        return out

    def _finish(self, writer: ChunkWriter, finish: str) -> list[bytes]:
        self.finished = True
        self.metrics.finish_reason = finish
        self._answer.finish(self.metrics, self._options)
        out = [writer.delta({}, finish)]
        if self._options.include_usage:
            out.append(writer.usage(self.metrics))
        return out
