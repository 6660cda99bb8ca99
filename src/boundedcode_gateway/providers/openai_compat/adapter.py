"""The adapter for every OpenAI-shaped upstream; the kinds differ only by their ``Dialect`` row.

For ``provider: local`` it reads ``GET /props`` once: a server that answers is
llama.cpp and its chat template's flags decide the capabilities; one that does
not is "another local OpenAI-compatible server" with assumed capabilities.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from boundedcode_gateway.config import GatewayConfig, ModelProfile, PoolServer, ServerSettings
from boundedcode_gateway.errors import (
    GatewayError,
    InvalidRequest,
    MalformedResponse,
    MissingApiKey,
)
from boundedcode_gateway.llama_server.api import LlamaServerAPI, MalformedAnswer, ServerRefused
from boundedcode_gateway.llama_server.cache_keeper import CacheServer
from boundedcode_gateway.llama_server.flags import (
    LOOPBACK,
    ServerCommand,
    server_command,
    slots_of,
)
from boundedcode_gateway.llama_server.launcher import ManagedLlamaServer
from boundedcode_gateway.llama_server.locate import (
    find_llama_server,
    resolve_model_path,
    resolve_server_files,
)
from boundedcode_gateway.llama_server.pool import PoolMember, ServerLease, ServerPool
from boundedcode_gateway.llama_server.slots import SlotTable
from boundedcode_gateway.policy.capabilities import check_media
from boundedcode_gateway.policy.mid_system import ADJUSTMENT as FOLDED_ADJUSTMENT
from boundedcode_gateway.policy.mid_system import fold_system_messages
from boundedcode_gateway.policy.reasoning import REASONING_KIND, StoredReasoning
from boundedcode_gateway.policy.retry import RetryBudget, RetryRules
from boundedcode_gateway.policy.volatile_lines import ADJUSTMENT as VOLATILE_ADJUSTMENT
from boundedcode_gateway.policy.volatile_lines import strip_system_messages
from boundedcode_gateway.pools.server_state import ServerState
from boundedcode_gateway.providers.base import (
    ChatCall,
    Continuation,
    PartialAnswer,
    PreparedRequest,
    RequestOptions,
    StreamTranslator,
)
from boundedcode_gateway.providers.openai_compat.continuation import (
    continuation_body,
    server_flags_continue,
)
from boundedcode_gateway.providers.openai_compat.dialects import (
    DIALECT_BY_PROVIDER,
    LLAMA_CPP,
    Dialect,
)
from boundedcode_gateway.providers.openai_compat.mapping import (
    error_from_openai_compat,
    from_openai_compat_response,
    to_openai_compat_request,
)
from boundedcode_gateway.providers.openai_compat.stream import OpenAIStreamTranslator
from boundedcode_gateway.providers.openai_compat.template_checks import (
    NEWLINE_BUDGET_MESSAGE,
    PROBE_MESSAGES,
    PROBE_MID_SYSTEM_MESSAGES,
    reasoning_back_refusal,
    renders_mid_system,
    renders_newline_before_end,
)
from boundedcode_gateway.upstream.capabilities import Capabilities, SystemMessages
from boundedcode_gateway.upstream.http import HttpClient
from boundedcode_gateway.upstream.metrics import CallMetrics
from boundedcode_gateway.upstream.probe import ServerProbe

log = logging.getLogger(__name__)

# the reasoning store's file for reasoning text, in each task's folder
REASONING_FILES = {REASONING_KIND: "local-replay.jsonl"}
# a request rendered to count its tokens, never sent
_COUNT_OPTIONS = RequestOptions(stream=False, include_usage=False, return_progress=False)


def capabilities_from_props(
    props: dict[str, Any],
    takes_reasoning: bool,
    continues: bool = True,
    refusal: str | None = None,
    system_messages: SystemMessages = "folded",
    media_urls: bool = False,
) -> Capabilities:
    """llama.cpp's capabilities, derived from its ``/props`` answer (``continues``: its
    command line, where the gateway knows it, lets it go on with a partial answer;
    ``system_messages``: what the template probe showed of a system message after the
    start; ``media_urls``: the profile lets media parts name URLs for the server to
    fetch)."""
    caps = props.get("chat_template_caps") or {}
    modalities = props.get("modalities") or {}
    settings = props.get("default_generation_settings") or {}
    n_ctx = settings.get("n_ctx")
    return Capabilities(
        streaming=True,
        reasoning_back=takes_reasoning,
        structured_output=True,
        prompt_progress=True,
        source="props",
        tools=bool(caps.get("supports_tools", True)),
        vision=bool(modalities.get("vision", False)),
        audio=bool(modalities.get("audio", False)),
        video=bool(modalities.get("video", False)),
        media_urls=media_urls,
        context_tokens=n_ctx if isinstance(n_ctx, int) else None,
        reasoning_back_refusal=refusal,
        continue_after_break=continues,
        system_messages=system_messages,
    )


class OpenAICompatUpstream:
    """One model profile served by an OpenAI-shaped API."""

    def __init__(self, name: str, profile: ModelProfile, config: GatewayConfig, http: HttpClient):
        self.name = name
        self.provider: str = profile.provider
        self.upstream_model = profile.model or name
        self._profile = profile
        self._setting = config.reasoning_history_for(profile)
        self._http = http
        self._dialect: Dialect = DIALECT_BY_PROVIDER[profile.provider]
        self._template_preserves = False
        # sent with a reasoning budget where the template writes "\n</think>"
        self._budget_message: str | None = None
        self._caps: Capabilities | None = None
        self._caps_lock = asyncio.Lock()
        # a local profile's servers (one, or several: docs/scaling.md); none for a cloud API
        self._pool = _server_pool(name, profile, config, http, self._auth_headers)
        self._api = LlamaServerAPI(http, self._headers_for)
        # the one server of a profile that names one, when the gateway runs it
        self.managed = _single_managed(self._pool)
        # the one server of a profile that names one the gateway does not run: is it
        # answering (for readiness)
        self._probe = (
            ServerProbe(self._server_root() + "/health", http, self._auth_headers)
            if self._pool is not None and not self._pool.several and self.managed is None
            else None
        )
        self._budget = RetryBudget(profile.retry.max_attempts, profile.retry.max_total_s)

    @property
    def retry_rules(self) -> RetryRules:
        return self._dialect.retry

    @property
    def retry_budget(self) -> RetryBudget:
        return self._budget

    @property
    def schema_form(self) -> str:
        return "response_format"

    def _assumed(self) -> Capabilities:
        d = self._dialect
        return Capabilities(
            streaming=True,
            reasoning_back=d.takes_reasoning(self._setting, self._template_preserves),
            structured_output=True,
            prompt_progress=d.prompt_progress,
            source=d.capability_source,
            # a cloud API takes system messages anywhere; a local server that is not
            # llama.cpp has a template the gateway cannot probe: folded, which any takes
            system_messages="folded" if self.provider == "local" else "in_place",
            media_urls=self._profile.takes_media_urls,
        )

    async def capabilities(self) -> Capabilities:
        """Read once; a local server that cannot be reached yet is asked again next time."""
        if self._caps is not None:
            return self._caps
        if self.provider != "local":
            self._caps = self._assumed()
            return self._caps
        async with self._caps_lock:
            if self._caps is None:
                self._caps = await self._read_props()
            return self._caps or self._assumed()

    def _server_root(self) -> str:
        """Where a local server listens (a managed one moves to a new port on restart); of
        a pool, the first that is up."""
        assert self._pool is not None
        return self._pool.healthy_root()

    def _chat_url(self, server: ServerLease | None, request_bytes: int) -> str:
        if server is not None:
            return server.root(request_bytes) + "/v1/chat/completions"
        return self._profile.upstream_base_url + "/chat/completions"

    def server_lease(
        self, task: str, purpose: str, caller: str | None = None
    ) -> ServerLease | None:
        """A local call's server, chosen when its request is made; under cache isolation,
        with the group whose slots it may use (its task, or its caller's key)."""
        if self._pool is None:
            return None
        isolation = self._profile.cache_isolation
        if isolation == "none":
            group = None
        elif isolation == "task":
            group = f"task:{task}"
        else:
            group = f"key:{caller or ''}"
        return self._pool.lease((task, purpose), group)

    async def start(self) -> None:
        """Start the managed llama-servers, if the profile has any; a pool is probed and
        checked (its servers must agree on ``/props``)."""
        if self._pool is not None:
            await self._pool.start()

    async def _read_props(self) -> Capabilities | None:
        props: dict[str, Any] | None
        try:
            props = await self._api.props(self._server_root())
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
            return self._assumed()
        self._dialect = LLAMA_CPP
        self._template_preserves = bool(
            props["chat_template_caps"].get("supports_preserve_reasoning", False)
        )
        takes = self._dialect.takes_reasoning(self._setting, self._template_preserves)
        refusal = None if takes else reasoning_back_refusal(props, self._template_preserves)
        if refusal is not None and self._setting == "auto":
            log.warning("model %s: earlier reasoning cannot go back: %s", self.name, refusal)
        else:
            refusal = None
        await self._probe_template()
        in_place = renders_mid_system(await self._render(PROBE_MID_SYSTEM_MESSAGES))
        return capabilities_from_props(
            props,
            takes,
            self._flags_continue(),
            refusal,
            "in_place" if in_place else "folded",
            self._profile.takes_media_urls,
        )

    async def _probe_template(self) -> None:
        """Render one probe conversation to see how the template closes reasoning."""
        rendered = await self._render(PROBE_MESSAGES)
        if rendered is not None and renders_newline_before_end(rendered):
            self._budget_message = NEWLINE_BUDGET_MESSAGE

    async def _render(self, messages: list[dict[str, Any]]) -> str | None:
        """The prompt the template renders ``messages`` to; None where it refuses them."""
        try:
            answer = await self._api.apply_template(self._server_root(), {"messages": messages})
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
        if self._pool is None:
            return True
        return all(
            server_flags_continue(member.extra_args)
            for member in self._pool.members
            if member.managed is not None
        )

    def _continues(self) -> bool:
        caps = self._caps
        return (
            self._dialect.continues_after_break and caps is not None and caps.continue_after_break
        )

    def _auth_headers(self) -> dict[str, str]:
        key = self._profile.api_key()
        if self._profile.api_key_env and key is None:
            raise MissingApiKey(
                f"model '{self.name}' needs the environment variable "
                f"{self._profile.api_key_env}, which is not set"
            )
        return {"Authorization": f"Bearer {key}"} if key else {}

    def _headers_for(self, url: str) -> dict[str, str]:
        """A request to ``url``'s credentials: a managed server's key where one listens
        there, else the profile's ``api_key_env``."""
        if self._pool is not None:
            return self._pool.headers_for(url)
        return self._auth_headers()

    def secrets(self) -> tuple[str, ...]:
        return self._profile.secrets()

    def prepare(self, call: ChatCall, send_schema: bool) -> PreparedRequest:
        """The HTTP request for this upstream, earlier reasoning restored where it is taken."""

        def lookup(keys: Sequence[str]) -> StoredReasoning | None:
            item = call.reasoning.find(REASONING_KIND, keys)
            if item is None or not isinstance(item.data, str):
                return None
            return StoredReasoning(item.profile, item.data)

        stream = call.options.stream
        out = to_openai_compat_request(
            call.body,
            model=self.upstream_model,
            dialect=self._dialect,
            options=call.options,
            takes_reasoning=call.caps.reasoning_back,
            profile=self.name,
            lookup=lookup,
            required_on_tool_turns=(
                self._setting == "keep" and self._dialect.reasoning_on_tool_turns_under_keep
            ),
            schema=call.schema,
            send_schema=send_schema,
        )
        adjustments: dict[str, Any] = {}
        if self._profile.cache_isolation != "none":
            _keep_to_own_slot(out)
        if self._pool is not None:
            # a local server's cache: a line new on every request would stop the match there
            messages, removed = strip_system_messages(out["messages"])
            if removed:
                out["messages"] = messages
                adjustments[VOLATILE_ADJUSTMENT] = removed
        if call.caps.system_messages == "folded":
            # after the volatile lines are out: a folded block is a user turn's text
            messages, folded = fold_system_messages(out["messages"])
            out["messages"] = messages
            if folded:
                adjustments[FOLDED_ADJUSTMENT] = folded
        if self._budget_message is not None and _needs_budget_message(out):
            out["reasoning_budget_message"] = self._budget_message
            adjustments["reasoning_budget_message"] = self._budget_message
        body = orjson.dumps(out)
        url = self._chat_url(call.server, len(body))
        headers = {"Content-Type": "application/json", **self._headers_for(url)}
        if stream:
            headers["Accept"] = "text/event-stream"
        if self._dialect.idempotency_key:
            headers["Idempotency-Key"] = call.call_id
        return PreparedRequest(
            url=url,
            headers=headers,
            body=body,
            resend_safe=self._dialect.idempotency_key,
            adjustments=adjustments,
            server=call.server,
        )

    def learn_from_refusal(self, status: int, message: str) -> bool:
        return False  # the caller's fields pass through: a refusal is the caller's to see

    def stream_translator(self, options: RequestOptions) -> StreamTranslator:
        return OpenAIStreamTranslator(options, self.secrets(), keep_shown=self._continues())

    def continuation(
        self, sent: PreparedRequest, partial: PartialAnswer, options: RequestOptions
    ) -> Continuation | None:
        """llama.cpp goes on with a partial text answer given as the final message."""
        body = continuation_body(sent.body, partial) if self._continues() else None
        if body is None:
            return None
        secrets = self.secrets()
        return Continuation(
            dataclasses.replace(sent, body=body, adjustments={}),
            lambda: OpenAIStreamTranslator(options, secrets, continuing=partial),
        )

    def from_response(self, raw: bytes, metrics: CallMetrics, options: RequestOptions) -> bytes:
        return from_openai_compat_response(
            raw, metrics, options.capture_reasoning, options.capture_content, options.capture_answer
        )

    def error_from_response(
        self, status: int, raw: bytes, headers: Mapping[str, str]
    ) -> GatewayError:
        return error_from_openai_compat(status, raw, self.secrets())

    def cache_server(self) -> CacheServer | None:
        """The llama.cpp server's cache, once ``/props`` showed the server is llama.cpp."""
        if self._dialect is not LLAMA_CPP:
            return None
        assert self._pool is not None
        repair = all(m.cache_repair for m in self._pool.members)
        return CacheServer(self._headers_for, repair)

    async def count_tokens(self, body: dict[str, Any]) -> int | None:
        """The tokens of the prompt ``body`` renders to on a llama.cpp server: its chat
        template (``POST /apply-template``) over the messages as a call would send them
        (without reasoning the store would restore), then its tokenizer
        (``POST /tokenize``); None for any other server or service. The template's
        rendering loads the media parts as a call does, so they are held to the same
        rules first."""
        caps = await self.capabilities()
        if self._dialect is not LLAMA_CPP:
            return None
        check_media(body, caps, self.name)
        out = to_openai_compat_request(
            body,
            model=self.upstream_model,
            dialect=self._dialect,
            options=_COUNT_OPTIONS,
            takes_reasoning=caps.reasoning_back,
            profile=self.name,
        )
        out["messages"] = strip_system_messages(out["messages"])[0]
        if caps.system_messages == "folded":
            out["messages"] = fold_system_messages(out["messages"])[0]
        root = self._server_root()
        try:
            prompt = (await self._api.apply_template(root, out)).get("prompt")
            if not isinstance(prompt, str):
                raise MalformedResponse("the server's /apply-template answered no prompt")
            tokens = (await self._api.tokenize(root, {"content": prompt})).get("tokens")
        except ServerRefused as exc:
            raise error_from_openai_compat(exc.status, exc.body, self.secrets()) from None
        except MalformedAnswer as exc:
            raise MalformedResponse(
                f"the server answered {root}{exc.path} with no JSON object"
            ) from None
        if not isinstance(tokens, list):
            raise MalformedResponse("the server's /tokenize answered no tokens")
        return len(tokens)

    async def readiness(self) -> str | None:
        """A key the profile names is set; a managed server is healthy, another local
        server answers its ``/health``."""
        missing = self._profile.key_missing()
        if missing is not None:
            return missing
        pool = self._pool
        if pool is not None and pool.several:
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

    def server_restarts(self) -> int | None:
        managed = [m.managed for m in self._pool.members if m.managed] if self._pool else []
        return sum(m.restarts for m in managed) if managed else None

    async def servers(self) -> list[dict[str, Any]]:
        """A local profile's servers: each one's state (and, when managed, its process),
        a summary of its ``/slots`` and, in a pool, what routing knows of it; none for a
        cloud API."""
        pool = self._pool
        if pool is None:
            return []
        return [await self._server(pool, i) for i in range(len(pool.members))]

    async def _server(self, pool: ServerPool, index: int) -> dict[str, Any]:
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
        if pool.several:
            server["routing"] = pool.describe(index)
        return server

    async def _slots_summary(self, root: str) -> dict[str, Any] | None:
        """How many slots, how many busy, each one's context and cached tokens (None where
        the server has no ``/slots``); never a slot's prompt or text."""
        try:
            slots = await self._api.slots(root)
        except (GatewayError, ServerRefused, MalformedAnswer):
            return None
        if not isinstance(slots, list):
            return None
        return slots_summary(slots)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()


def _server_pool(
    name: str,
    profile: ModelProfile,
    config: GatewayConfig,
    http: HttpClient,
    headers: Callable[[], dict[str, str]],
) -> ServerPool | None:
    """A local profile's servers (checked at start-up); None for a cloud API."""
    servers = profile.pool_servers() if profile.provider == "local" else ()
    if not servers:
        return None
    several = len(servers) > 1
    members = []
    for i, server in enumerate(servers):
        # a pool's servers are told apart by their place in it
        label = f"{name}[{i}]" if several else name
        where = f"models.{name}.servers[{i}]" if profile.servers is not None else f"models.{name}"
        members.append(
            _member(label, where, server, config, http, profile.cache_isolation != "none")
        )
    return ServerPool(name, members, profile.routing_policy, http, headers)


def _member(
    label: str,
    where: str,
    server: PoolServer,
    config: GatewayConfig,
    http: HttpClient,
    isolated: bool = False,
) -> PoolMember:
    settings = server.server or ServerSettings()
    if server.external_url:
        url = server.external_url.rstrip("/")
        return PoolMember(ServerState(url_shown(url)), url, cache_repair=settings.cache_repair)
    assert server.model_path is not None
    binary = find_llama_server(config.llama_server_bin)
    model = str(resolve_model_path(server.model_path, f"{where}.model_path"))
    settings = resolve_server_files(settings, f"{where}.server")

    folder = config.data_path / "llama-server"
    slot_dir = folder / f"{label}.slots" if isolated else None

    def command_for_port(port: int) -> ServerCommand:
        if slot_dir is not None:
            private_folder(slot_dir)
        return server_command(binary, model, port, label, settings, slot_dir)

    log_path = folder / f"{label}.log"
    managed = ManagedLlamaServer(
        label, command_for_port, log_path, settings.startup_timeout_s, http
    )
    state = ServerState(label, slots_of(settings))
    slots = SlotTable(slots_of(settings)) if isolated else None
    return PoolMember(state, None, managed, settings.cache_repair, settings.extra_args, slots=slots)


def private_folder(path: Path) -> None:
    """A folder only the gateway's user can enter (what the server may save of a slot's
    prompt lands there; the gateway itself saves nothing)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)


def _single_managed(pool: ServerPool | None) -> ManagedLlamaServer | None:
    if pool is None or pool.several:
        return None
    return pool.members[0].managed


def url_shown(url: str) -> str:
    """A server's URL without credentials, for records and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit((parts.scheme, host + port, parts.path, parts.query, parts.fragment))


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


# the fields that would run a call in a slot the gateway did not give it: a slot named by
# the caller, and further choices (``n``, ``n_cmpl``), which llama-server runs in other
# free slots
_OWN_SLOT_FIELDS = ("id_slot",)
_CHOICE_FIELDS = ("n", "n_cmpl")


def _keep_to_own_slot(out: dict[str, Any]) -> None:
    """Under cache isolation a call runs in its group's slot alone: a caller's ``id_slot``
    is taken out (the gateway pins the call), and more than one choice is refused."""
    for key in _OWN_SLOT_FIELDS:
        out.pop(key, None)
    for key in _CHOICE_FIELDS:
        value = out.get(key)
        if value is not None and value != 1:
            raise InvalidRequest(
                f"'{key}' must be 1 on this model: its prompt cache is kept per "
                "caller, and further choices would run in other callers' slots",
                param=key,
            )


def _needs_budget_message(body: dict[str, Any]) -> bool:
    budget = body.get("reasoning_budget_tokens")
    return isinstance(budget, int) and budget >= 0 and "reasoning_budget_message" not in body
