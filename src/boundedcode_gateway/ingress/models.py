"""``/v1/models`` and ``/v1/models/{name}``: the profiles a caller may use, as OpenAI's
model objects with their capabilities; one asked for by name with its servers too."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson

from boundedcode_gateway.asgi.render import send_json
from boundedcode_gateway.call_context import Caller
from boundedcode_gateway.errors import ModelNotFound
from boundedcode_gateway.ingress.table import Request, Route
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.text import clip

MODELS_PATH = "/v1/models"


class Models:
    """The models endpoints, with any method, as ever."""

    def __init__(self, service: GatewayService) -> None:
        self.service = service
        # every model's ``created``
        self.started_at = time.time()

    def routes(self) -> Iterator[tuple[str, Route]]:
        yield MODELS_PATH, Route(self._list)
        yield MODELS_PATH + "/{name:path}", Route(self._one)

    async def _list(self, request: Request) -> None:
        caller = request.caller
        names = [n for n in self.service.upstreams if caller is None or caller.may_use(n)]
        shown = {"object": "list", "data": [await self._model(n, caller) for n in names]}
        await send_json(request.send, 200, orjson.dumps(shown))

    async def _one(self, request: Request) -> None:
        model = await self._model(request.params["name"], request.caller, with_servers=True)
        await send_json(request.send, 200, orjson.dumps(model))

    async def _model(
        self, name: str, caller: Caller | None, with_servers: bool = False
    ) -> dict[str, Any]:
        """A profile as OpenAI's model object, with its capabilities; ``with_servers``: and
        a local profile's servers with their state (one model asked for by name)."""
        upstream = self.service.upstreams.get(name)
        # a model the caller may not use is not shown to exist
        if upstream is None or (caller is not None and not caller.may_use(name)):
            raise ModelNotFound(
                f"The model '{clip(name)}' does not exist on this gateway", param="model"
            )
        caps = (await upstream.capabilities()).to_json()
        if self.service.structured_output_refused(upstream):
            caps["structured_output"] = False
        model = {
            "id": name,
            "object": "model",
            "created": int(self.started_at),
            "owned_by": upstream.provider,
            "upstream_model": upstream.upstream_model,
            "capabilities": caps,
        }
        servers = await self.service.servers_of(name) if with_servers else None
        if servers is not None:
            # names and states only: a process's command line is for the page of calls
            model["servers"] = [{"name": s["name"], "state": s["state"]} for s in servers]
        slot_files = self.service.slot_files_of(name) if with_servers else None
        if slot_files is not None:
            model["slot_files"] = slot_files
        return model
