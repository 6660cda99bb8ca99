"""One local profile's servers, as one object: everything the gateway runs or asks of them.

Its pool (one server or several, managed or not), their traits read once from
``GET /props`` and the chat template (a server that answers ``/props`` as llama.cpp
does is llama.cpp; one that does not is "another local OpenAI-compatible server"),
readiness, restarts, token counts, the operator's view of each server, the lease of a
server to a call, and the cache keeper of a llama.cpp profile's answers. It knows no
provider's wire format: the request whose prompt it counts, and the error a refused
count becomes, are the adapter's (``counts_with``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from boundedcode_gateway.config import GatewayConfig, ModelProfile, PriceSettings
from boundedcode_gateway.errors import GatewayError, MalformedResponse
from boundedcode_gateway.llama_server.api import MalformedAnswer, ServerRefused
from boundedcode_gateway.llama_server.cache_keeper import CacheKeeper
from boundedcode_gateway.llama_server.flags import LOOPBACK, server_flags_continue
from boundedcode_gateway.llama_server.pool import PoolMember, ServerLease, ServerPool
from boundedcode_gateway.llama_server.probe import ServerProbe
from boundedcode_gateway.llama_server.servers import server_pool
from boundedcode_gateway.llama_server.slot_files import SlotFiles
from boundedcode_gateway.llama_server.slot_store import SlotStore
from boundedcode_gateway.llama_server.template_checks import (
    NEWLINE_BUDGET_MESSAGE,
    PROBE_MESSAGES,
    PROBE_MID_SYSTEM_MESSAGES,
    reasoning_back_refusal,
    renders_mid_system,
    renders_newline_before_end,
)
from boundedcode_gateway.metering.bus import RecordSink
from boundedcode_gateway.upstream.http import HttpClient
from boundedcode_gateway.upstream.profile_key import bearer_headers
from boundedcode_gateway.upstream.server_traits import ServerTraits

log = logging.getLogger(__name__)

# the request whose prompt is counted (None: the servers cannot count it), and what a
# server's refusal of it is to the caller
CountRequest = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]
CountRefused = Callable[[int, bytes, Mapping[str, str]], GatewayError]


class LocalFleet:
    """A local profile's servers: started, read, leased, followed and shown."""

    def __init__(
        self,
        name: str,
        pool: ServerPool,
        isolation: str = "none",
    ) -> None:
        self.name = name
        self.pool = pool
        # ``cache_isolation``: whose slots a call may use
        self._isolation = isolation
        self.api = pool.api
        # the one server of a profile that names one, when the gateway runs it
        self.managed = None if pool.several else pool.members[0].managed
        # the one server of a profile that names one the gateway does not run: is it
        # answering (for readiness)
        self._probe = (
            ServerProbe(pool.api, pool.healthy_root())
            if not pool.several and self.managed is None
            else None
        )
        self._traits: ServerTraits | None = None
        self._traits_lock = asyncio.Lock()
        self._count_request: CountRequest | None = None
        self._count_refused: CountRefused | None = None
        self._keeper: CacheKeeper | None = None
        pool.restarted = self._server_restarted

    def counts_with(self, request: CountRequest, refused: CountRefused) -> None:
        """How a body to count becomes the request the template renders, and what a
        server's refusal of it is (the adapter's translation)."""
        self._count_request = request
        self._count_refused = refused

    async def start(self) -> None:
        """Start the managed llama-servers, if the profile has any; a pool is probed and
        checked (its servers must agree on ``/props``)."""
        await self.pool.start()

    async def close(self) -> None:
        """Stop the cache keeper's follow-ups, then the servers the gateway runs."""
        if self._keeper is not None:
            await self._keeper.close()
        await self.pool.close()

    # -- the servers' traits

    async def traits(self) -> ServerTraits | None:
        """Read once; servers that cannot be reached yet are asked again next time."""
        if self._traits is not None:
            return self._traits
        async with self._traits_lock:
            if self._traits is None:
                self._traits = await self._read_traits()
            return self._traits

    async def _read_traits(self) -> ServerTraits | None:
        props: dict[str, Any] | None
        try:
            props = await self.api.props(self.pool.healthy_root())
        except GatewayError as exc:
            log.warning("model %s: cannot read /props yet: %s", self.name, exc.message)
            return None
        except ServerRefused as exc:
            if exc.status == 503:  # still loading the model
                return None
            props = None
        except MalformedAnswer:
            props = None
        if props is None or "chat_template_caps" not in props:
            log.info(
                "model %s: no llama.cpp /props; treated as a local OpenAI-compatible server",
                self.name,
            )
            return ServerTraits(llama_cpp=False)
        caps = props.get("chat_template_caps") or {}
        keeps = bool(caps.get("supports_preserve_reasoning", False))
        # how the template closes reasoning, and where it renders a later system message
        probe = await self._render(PROBE_MESSAGES)
        newline = probe is not None and renders_newline_before_end(probe)
        in_place = renders_mid_system(await self._render(PROBE_MID_SYSTEM_MESSAGES))
        modalities = props.get("modalities") or {}
        n_ctx = (props.get("default_generation_settings") or {}).get("n_ctx")
        return ServerTraits(
            llama_cpp=True,
            keeps_reasoning=keeps,
            reasoning_refusal=reasoning_back_refusal(props, keeps),
            budget_message=NEWLINE_BUDGET_MESSAGE if newline else None,
            system_in_place=in_place,
            continues=self._flags_continue(),
            context_tokens=n_ctx if isinstance(n_ctx, int) else None,
            tools=bool(caps.get("supports_tools", True)),
            vision=bool(modalities.get("vision", False)),
            audio=bool(modalities.get("audio", False)),
            video=bool(modalities.get("video", False)),
        )

    async def _render(self, messages: list[dict[str, Any]]) -> str | None:
        """The prompt the template renders ``messages`` to; None where it refuses them."""
        try:
            answer = await self.api.apply_template(self.pool.healthy_root(), {"messages": messages})
        except GatewayError as exc:
            log.info("model %s: cannot render the template probe: %s", self.name, exc.message)
            return None
        except (ServerRefused, MalformedAnswer):
            return None
        rendered = answer.get("prompt")
        return rendered if isinstance(rendered, str) else None

    def _flags_continue(self) -> bool:
        """A server the gateway runs can continue unless its extra flags say otherwise; one
        it does not run is taken to run with llama-server's defaults, which can."""
        return all(
            server_flags_continue(member.extra_args)
            for member in self.pool.members
            if member.managed is not None
        )

    # -- calls

    def lease(
        self, task: str, purpose: str, caller: str | None = None, head: str = ""
    ) -> ServerLease:
        """A local call's server, chosen when its request is made; under cache isolation,
        with the group whose slots it may use (its task, or its caller's key); ``head``:
        a digest of the request's first message (its slot's conversation)."""
        isolation = self._isolation
        if isolation == "none":
            group = None
        elif isolation == "task":
            group = f"task:{task}"
        else:
            group = f"key:{caller or ''}"
        return self.pool.lease((task, purpose), group, head)

    def keeper(self, records: RecordSink, price: PriceSettings | None) -> CacheKeeper | None:
        """The follow-up of a llama.cpp profile's answers (made on first use, once the
        servers showed they are llama.cpp); None for any other server."""
        files = self.pool.slot_files
        if files is not None and files.records is None:
            files.records = records
        if self._keeper is None:
            traits = self._traits
            if traits is None or not traits.llama_cpp:
                return None
            repair = all(m.cache_repair for m in self.pool.members)
            self._keeper = CacheKeeper(self.name, self.api, repair, records, price)
        return self._keeper

    def _server_restarted(self, member: PoolMember) -> None:
        """A managed server is ready again, its cache empty: where its slots cannot be
        restored, the conversations it served last are evaluated again while it is idle."""
        keeper, table = self._keeper, member.slots
        if keeper is None or table is None:
            return
        files = self.pool.slot_files
        if files is not None and files.restoring(member):
            return  # each conversation's file is restored before its next call
        keeper.rewarm(member.state, member.root(), table)

    @property
    def pins_slots(self) -> bool:
        """Whether calls are pinned to slots the gateway chooses (slot files, isolation)."""
        return any(m.slots is not None for m in self.pool.members)

    @property
    def slot_files(self) -> SlotFiles | None:
        """The save and restore of the servers' slots per conversation (None: off)."""
        return self.pool.slot_files

    def slot_files_view(self) -> dict[str, Any] | None:
        """What the slot files did for this profile, and the servers restored to no more
        (their restores bought nothing), with why."""
        files = self.pool.slot_files
        if files is None:
            return None
        return {
            **dataclasses.asdict(files.counts),
            "not_restoring": files.not_restoring(self.pool.members),
        }

    @property
    def cache_keeper(self) -> CacheKeeper | None:
        """The keeper made so far, if any."""
        return self._keeper

    async def count_tokens(self, body: dict[str, Any]) -> int | None:
        """The tokens of the prompt ``body`` renders to on a llama.cpp server: its chat
        template (``POST /apply-template``) over the request the adapter makes of it, then
        its tokenizer (``POST /tokenize``); None for any other server."""
        if self._count_request is None or self._count_refused is None:
            return None
        request = await self._count_request(body)
        if request is None:
            return None
        root = self.pool.healthy_root()
        try:
            prompt = (await self.api.apply_template(root, request)).get("prompt")
            if not isinstance(prompt, str):
                raise MalformedResponse("the server's /apply-template answered no prompt")
            tokens = (await self.api.tokenize(root, {"content": prompt})).get("tokens")
        except ServerRefused as exc:
            raise self._count_refused(exc.status, exc.body, {}) from None
        except MalformedAnswer as exc:
            raise MalformedResponse(
                f"the server answered {root}{exc.path} with no JSON object"
            ) from None
        if not isinstance(tokens, list):
            raise MalformedResponse("the server's /tokenize answered no tokens")
        return len(tokens)

    # -- what an operator is shown

    async def readiness(self) -> str | None:
        """A managed server is healthy, another server answers its ``/health``; of a pool,
        one server is up."""
        pool = self.pool
        if pool.several:
            if any(m.state.healthy for m in pool.members):
                return None
            return f"none of its {len(pool.members)} servers is up"
        if self.managed is not None:
            if self.managed.ready:
                return None
            state = "restarting" if self.managed.restarts else "starting"
            return f"its llama-server is {state}"
        if self._probe is not None:
            return await self._probe.check()
        return None

    def restarts(self) -> int | None:
        """How often the profile's managed llama-servers were started again after they
        exited; None for a profile without one."""
        managed = [m.managed for m in self.pool.members if m.managed]
        return sum(m.restarts for m in managed) if managed else None

    async def servers(self) -> list[dict[str, Any]]:
        """Each server's state (and, when managed, its process), a summary of its ``/slots``
        and, in a pool, what routing knows of it."""
        return [await self._server(i) for i in range(len(self.pool.members))]

    async def _server(self, index: int) -> dict[str, Any]:
        pool = self.pool
        member = pool.members[index]
        server: dict[str, Any] = {"name": member.state.name}
        root: str | None
        if member.managed is not None:
            status = member.managed.status()
            server.update(managed=True, **dataclasses.asdict(status))
            root = f"http://{LOOPBACK}:{status.port}" if status.state == "ready" else None
        else:
            root = member.url
            if pool.several:
                down = None if member.state.healthy else "it did not answer its last probe"
            else:
                down = await self._probe.check() if self._probe is not None else None
            server.update(managed=False, url=root, state="down" if down else "ready")
            if down:
                server["reason"] = down
                root = None
        server["slots"] = await self._slots_summary(root) if root is not None else None
        files = pool.slot_files
        if files is not None and member.slot_dir is not None:
            server["restoring_slots"] = files.restoring(member)
        if pool.several:
            server["routing"] = pool.describe(index)
        return server

    async def _slots_summary(self, root: str) -> dict[str, Any] | None:
        """How many slots, how many busy, each one's context and cached tokens (None where
        the server has no ``/slots``); never a slot's prompt or text."""
        try:
            slots = await self.api.slots(root)
        except (GatewayError, ServerRefused, MalformedAnswer):
            return None
        if not isinstance(slots, list):
            return None
        return slots_summary(slots)


def local_fleet(
    name: str,
    profile: ModelProfile,
    config: GatewayConfig,
    http: HttpClient,
    store: SlotStore | None = None,
) -> LocalFleet | None:
    """The servers of a local profile (built, not started); None for a cloud API.
    ``store``: the gateway's slot files (None: slots are not saved)."""

    def headers() -> dict[str, str]:
        return bearer_headers(name, profile)

    pool = server_pool(name, profile, config, http, headers, store)
    if pool is None:
        return None
    return LocalFleet(name, pool, profile.cache_isolation)


def slots_summary(slots: list[Any]) -> dict[str, Any]:
    """llama-server's ``/slots`` as counts: no prompt, no generated text."""
    shown = [
        {
            "id": slot.get("id"),
            "busy": slot.get("is_processing") is True,
            "n_ctx": slot.get("n_ctx"),
            "cached_tokens": slot.get("n_prompt_tokens"),
        }
        for slot in slots
        if isinstance(slot, dict)
    ]
    return {"total": len(shown), "busy": sum(s["busy"] for s in shown), "slots": shown}
