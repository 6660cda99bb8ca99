"""The ASGI application: its lifespan owns the HTTP client, the upstreams, the record bus
and the meter writer; ``reload`` swaps in what a new configuration gives without dropping a call."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from boundedcode_gateway import private_files
from boundedcode_gateway.access.listen import listen_refusal
from boundedcode_gateway.access.sites import DEFAULT_LISTEN_HOST
from boundedcode_gateway.access.token_secret import token_secrets
from boundedcode_gateway.asgi.body import BodyParser
from boundedcode_gateway.asgi.body_read import ReadingBudget
from boundedcode_gateway.asgi.render import Receive, Send, send_error
from boundedcode_gateway.budgets.book import BudgetBook, budgets_configured
from boundedcode_gateway.budgets.shared import SharedBudgets
from boundedcode_gateway.budgets.store import LedgerSpendStore, SpendStore
from boundedcode_gateway.config import (
    ConfigSource,
    GatewayConfig,
    RateLimitSettings,
    UpstreamLimitsSettings,
)
from boundedcode_gateway.database.pool import PostgresPool
from boundedcode_gateway.errors import ConfigError, GatewayError, internal_error
from boundedcode_gateway.fronts.registry import fronts_by_path
from boundedcode_gateway.fronts.sealing import Sealer, key_id, read_ring
from boundedcode_gateway.ingress.routes import Router
from boundedcode_gateway.limits.limiter import CallLimits
from boundedcode_gateway.limits.shared import SharedWindows
from boundedcode_gateway.live_config import (
    Route,
    RouteChanges,
    build_live_config,
    restart_only_changes,
    route_changes,
)
from boundedcode_gateway.llama_server.fleet import LocalFleet
from boundedcode_gateway.llama_server.slot_store import SLOT_FILES_FOLDER, SlotStore
from boundedcode_gateway.locations import PostgresLocation, describe, explain
from boundedcode_gateway.metering.bus import RecordBus
from boundedcode_gateway.metering.calllog import read_tail
from boundedcode_gateway.metering.ledgers import prepare_ledger
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.observability.export import ExportCollector, Observability
from boundedcode_gateway.operations.failure_log import FailureLog
from boundedcode_gateway.operations.metrics import GatewayMetrics
from boundedcode_gateway.policy.cache_misses import ContinuityTable
from boundedcode_gateway.providers.base import Upstream
from boundedcode_gateway.retention import IdleTaskSweeper
from boundedcode_gateway.service import GatewayService
from boundedcode_gateway.state.backends import task_state_for
from boundedcode_gateway.ui.events import CallEvents
from boundedcode_gateway.ui.records import RecentRecords
from boundedcode_gateway.ui.routes import UiRoutes
from boundedcode_gateway.upstream.http import HttpClient, Limits, Timeouts
from boundedcode_gateway.upstream.proxy import ProxySettings

log = logging.getLogger(__name__)


# where `serve` listens unless told otherwise
# how much of the call log's end a start reads for the conversations' previous calls
CONTINUITY_TAIL_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What a reload did: applied (with the profiles' changes), or refused and why."""

    applied: bool
    reason: str | None = None
    changes: RouteChanges | None = None


def key_rate_limits(config: GatewayConfig) -> dict[str, RateLimitSettings]:
    """The keys that have rate limits of their own, by name."""
    if config.auth is None:
        return {}
    return {k.name: k.rate_limits for k in config.auth.keys if k.rate_limits is not None}


class GatewayApp:
    """ASGI callable; ``startup()``/``shutdown()`` also run from the ASGI lifespan."""

    def __init__(
        self,
        config: GatewayConfig,
        source: ConfigSource | None = None,
        listen_host: str = DEFAULT_LISTEN_HOST,
    ) -> None:
        self.config = config
        self._source = source
        # the address served: what requests may name as Host, kept across reloads
        self.listen_host = listen_host
        # what callers sent and what answered them lies there: the gateway user's alone
        private_files.private_data_folder(config.data_path)
        proxies = ProxySettings.from_environ(os.environ)
        if proxies.describe():
            log.info("proxy: %s", proxies.describe())
        inference = config.inference
        self.http = HttpClient(
            Timeouts(
                inference.connect_timeout_s,
                inference.read_timeout_s,
                inference.upstream_limits.header_timeout_s,
            ),
            proxies,
            upstream_limits(inference.upstream_limits),
        )
        self.writer = MeterWriter(
            config.calls_path,
            config.ledger_location,
            enabled=config.metering.enabled,
            sync=config.metering.sync,
            rotate_bytes=config.retention.call_log_bytes,
            rotated_files=config.retention.call_log_files,
            ledger_buffer_records=config.metering.ledger_buffer_records,
        )
        # each call's record, published once: the writer is its durable subscriber
        self.bus = RecordBus(self.writer)
        retention = config.retention
        memory = (retention.tasks_in_memory, retention.task_idle_s)
        # one pool per PostgreSQL database, for the stores kept there (the task state, the
        # budgets); the ledger's writer keeps its own connection in its thread
        self.databases: dict[PostgresLocation, PostgresPool] = {}
        # the reasoning store and the history behind `changed`: files, or `state:`'s database
        self.state = task_state_for(config, self._database)
        self.reasoning = self.state.reasoning
        # a restarted gateway goes on comparing each conversation with its previous call
        continuity = ContinuityTable.from_call_log(
            read_tail(config.calls_path, CONTINUITY_TAIL_BYTES), *memory
        )
        # no book where no call can have a budget: nothing to check or count per call; the
        # budgets of gateways that share a PostgreSQL ledger are kept in its database
        self.budgets: BudgetBook | SharedBudgets | None = None
        if budgets_configured(config):
            ledger = config.ledger_location
            if config.metering.enabled and isinstance(ledger, PostgresLocation):
                fail_open = config.budgets.when_store_down == "fail_open"
                self.budgets = SharedBudgets(
                    self._database(ledger), config.budgets.task, fail_open=fail_open
                )
            else:
                self.budgets = BudgetBook(config.budgets.task)
        # rate and concurrency limits: made whatever the configuration says, so that a
        # reload may add them (a call with none to meet costs a few lookups)
        shared = config.database_location
        ledger = config.ledger_location
        if shared is None and config.metering.enabled and isinstance(ledger, PostgresLocation):
            # the ledger's database, where the ledger is written: not asked otherwise
            shared = ledger
        # counted in the database gateways share, where there is one
        windows = SharedWindows(self._database(shared)) if shared is not None else None
        self.limits = CallLimits(config.rate_limits, key_rate_limits(config), windows)
        # what the budgets spent before this process: the ledger, unless nothing is written
        self.spend_store: SpendStore | None = (
            LedgerSpendStore(config.ledger_location) if config.metering.enabled else None
        )
        # what the page of calls is told as calls go, and the records it shows whole
        self.events = CallEvents()
        records = RecentRecords()
        self.bus.subscribe("the page's records", records.remember)
        # each conversation's saved llama-server slot, kept across servers and restarts
        self.slot_store = (
            SlotStore(config.data_path / SLOT_FILES_FOLDER, config.prompt_cache.disk_bytes)
            if config.prompt_cache.slot_files
            else None
        )
        # calls exported as OpenTelemetry traces and metrics (observability:), off the path
        try:
            self.observability = Observability(config.observability, os.environ)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.service = GatewayService(
            build_live_config(
                config, self.http, listen_host=listen_host, slot_store=self.slot_store
            ),
            self.http,
            self.bus,
            self.reasoning,
            continuity,
            budgets=self.budgets,
            limits=self.limits,
            history=self.state.history,
            events=self.events,
            content=self.observability,
        )
        self.metrics = GatewayMetrics(
            self.service,
            self.writer,
            self.events,
            state=self.state.database,
            limits=self.limits,
            budgets=self.budgets if isinstance(self.budgets, SharedBudgets) else None,
        )
        self.bus.subscribe("the metrics", self.metrics.observe)
        self.bus.subscribe("the OTLP export", self.observability.offer)
        self.metrics.registry.register(ExportCollector(self.observability))
        # a line on stderr per failed or refused call
        self.failures = FailureLog()
        self.bus.subscribe("the failure log", self.failures.observe)
        self.sweepers: list[IdleTaskSweeper] = []
        if retention.task_days is not None:
            self.sweepers.append(IdleTaskSweeper(self.state, retention.task_days))
            if self.slot_store is not None:
                self.sweepers.append(IdleTaskSweeper(self.slot_store, retention.task_days))
        self._sweeping: list[asyncio.Task[None]] = []
        self.body_parser = BodyParser(config.limits.max_parsing_bytes)
        ui = UiRoutes(
            self.service,
            self.events,
            records,
            config.calls_path,
            config.ledger_location if config.metering.enabled else None,
            listen_host,
        )
        self.sealer = Sealer.in_folder(config.data_path, max_age_s=config.reasoning.seal_max_age_s)
        fronts = fronts_by_path(self.sealer)
        self.router = Router(
            self.service,
            self.metrics,
            self.body_parser,
            ui,
            fronts,
            self.failures,
            ReadingBudget(config.limits.max_reading_bytes),
        )
        self._started = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reload_lock = asyncio.Lock()
        self._reloads: set[asyncio.Task[ReloadResult]] = set()

    def _database(self, location: PostgresLocation) -> PostgresPool:
        """The pool of the database at ``location``, one for all the stores kept there."""
        pool = self.databases.get(location)
        if pool is None:
            pool = self.databases[location] = PostgresPool(location)
        return pool

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop the gateway serves on, once started (to reload from elsewhere:
        ``asyncio.run_coroutine_threadsafe(app.reload(), app.loop)``)."""
        return self._loop

    @property
    def upstreams(self) -> dict[str, Upstream]:
        """The upstream of each model profile new calls go to."""
        return self.service.upstreams

    @property
    def fleets(self) -> dict[str, LocalFleet]:
        """The servers of each local profile new calls go to."""
        return self.service.live.fleets

    async def startup(self) -> None:
        """Check the ledger can be written (a database server's), start the record bus and the
        meter writer and learn each model's capabilities (failures to learn them are not
        fatal)."""
        if self._started:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        await self._prepare_ledger()
        await self._open_state()
        await self._open_budgets()
        await self._open_databases()
        self.bus.start()
        self.writer.start()
        self.observability.start(self.metrics.registry)
        self._sweeping = [asyncio.create_task(sweeper.run()) for sweeper in self.sweepers]
        await _start(self.service.live.routes.values())

    async def _prepare_ledger(self) -> None:
        """A PostgreSQL ledger that cannot be reached or migrated stops start-up: the gateway
        does not serve calls it could not record. (Once serving, the writer waits out an
        outage: metering/writer.py.)"""
        if not self.config.metering.enabled:
            return
        location = self.config.ledger_location
        try:
            await prepare_ledger(location)
        except Exception as exc:
            # from None: the cause's own text may quote the URL, password and all
            raise RuntimeError(
                f"cannot open the ledger {describe(location)}: {explain(location, exc)}"
            ) from None

    async def _open_databases(self) -> None:
        """The databases not opened yet by the task state or the budgets (the rate limits'
        windows): one that cannot be reached or migrated stops start-up."""
        for location, pool in self.databases.items():
            try:
                await pool.open()
            except Exception as exc:
                raise RuntimeError(
                    f"cannot open the database {describe(location)}: {explain(location, exc)}"
                ) from None

    async def _open_state(self) -> None:
        """A state database that cannot be reached or migrated stops start-up, as the
        ledger's does. (Once serving, a call goes on without it: state/database.py.)"""
        try:
            await self.state.open()
        except Exception as exc:
            location = self.config.state_location
            reason = explain(location, exc) if location is not None else str(exc)
            raise RuntimeError(f"cannot open {self.state.where}: {reason}") from None

    async def _open_budgets(self) -> None:
        """Read what each caller and task spent before this process, once, off the loop; or,
        for budgets several gateways share, open their tables in the ledger's database.

        A ledger that cannot be read stops start-up: budgets are not enforced blind.
        """
        if isinstance(self.budgets, SharedBudgets):
            location = self.config.ledger_location
            try:
                await self.budgets.start()
            except Exception as exc:
                raise RuntimeError(
                    f"cannot open the budgets in the ledger's database {describe(location)}: "
                    f"{explain(location, exc)}"
                ) from None
            return
        if self.budgets is None or self.spend_store is None:
            return
        try:
            spent = await asyncio.to_thread(self.spend_store.spent, self.budgets.today())
        except Exception as exc:
            location = self.config.ledger_location
            raise RuntimeError(
                f"cannot read the budgets' spending from the ledger {describe(location)}: "
                f"{explain(location, exc)}"
            ) from None
        self.budgets.restore(spent)
        log.info("budgets: spending of %d callers and tasks read from the ledger", len(spent))

    async def shutdown(self) -> None:
        """Close upstream connections and write every call still queued."""
        for task in list(self._reloads):
            task.cancel()
        await asyncio.gather(*self._reloads, return_exceptions=True)
        for sweeping in self._sweeping:
            sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeping
        await self.service.close()
        await self.http.close()
        await self.bus.close()
        await asyncio.to_thread(self.writer.close)
        await asyncio.to_thread(self.failures.close)
        await asyncio.to_thread(self.observability.close)
        if isinstance(self.budgets, SharedBudgets):
            # the writer has written what it could: what is still held is let go
            await self.budgets.close()
        await self.state.close()
        for pool in self.databases.values():
            await pool.close()
        self.body_parser.close()

    async def reload(self, config: GatewayConfig | None = None) -> ReloadResult:
        """Serve new calls from ``config`` (default: the source read again). Unchanged
        profiles keep their upstream; new and changed ones are started before any call
        reaches them; the upstreams they replace close once their calls end. A source that
        does not load is refused, and the running configuration kept."""
        async with self._reload_lock:
            result = await self._reload(config)
        self.metrics.reloaded(result.applied)
        return result

    async def _reload(self, config: GatewayConfig | None) -> ReloadResult:
        if not self._started:
            return _refused("the gateway is still starting")
        old = self.service.live
        try:
            if config is None:
                if self._source is None:
                    return _refused("the gateway was not started from a configuration source")
                config = await asyncio.to_thread(self._source.load)
            # read again each time: a new secret in its file revokes the old one's tokens
            secrets = (
                await asyncio.to_thread(token_secrets, config.auth, os.environ)
                if config.auth is not None
                else None
            )
            new = build_live_config(
                config,
                self.http,
                old,
                self.listen_host,
                secrets=secrets,
                slot_store=self.slot_store,
            )
            _check_listening(self.listen_host, old.config, config)
            replaced = self.observability.use(config.observability, os.environ)
        except ConfigError as exc:
            return _refused(str(exc))
        except ValueError as exc:  # an observability: that cannot export
            return _refused(str(exc))
        changes = route_changes(old, new)
        running = set(old.routes.values())
        fresh = [r for r in new.routes.values() if r not in running]
        try:
            await _start(fresh)
        except BaseException:
            await asyncio.gather(*(r.close() for r in fresh), return_exceptions=True)
            raise
        self.service.use(new)
        if replaced is not None:
            # its queued calls still go out, from a thread: no call waits on it
            asyncio.get_running_loop().run_in_executor(None, replaced.close)
        # an open page's event stream is let in again by the new keys, or ended
        self.events.recheck_viewers()
        self._use_budgets(config)
        self.limits.use(config.rate_limits, key_rate_limits(config))
        await self._use_seal_keys(config, old.config)
        self.config = config
        log.info("configuration reloaded: %s", changes.describe())
        for key in restart_only_changes(old.config, config):
            log.warning("configuration: %s changed; it takes effect at the next start", key)
        return ReloadResult(True, changes=changes)

    async def _use_seal_keys(self, config: GatewayConfig, running: GatewayConfig) -> None:
        """Sign and seal with the key ring as it is now (``seal-key rotate`` changed it),
        and hold what callers give back to the reloaded maximum age. The ring is the running
        ``data_dir``'s (a new one takes effect at the next start); one that cannot be read
        keeps the running ring."""
        self.sealer.use_max_age(config.reasoning.seal_max_age_s)
        try:
            ring = await asyncio.to_thread(read_ring, running.data_path)
        except (OSError, ValueError, ConfigError) as exc:
            log.error("the seal key ring cannot be read (the running one is kept): %s", exc)
            return
        if [key_id(k) for k in ring] != self.sealer.key_ids:
            self.sealer.use_ring(ring)
            log.info("seal keys: signing with %s", key_id(ring[0]))

    def _use_budgets(self, config: GatewayConfig) -> None:
        """Hold new calls to the reloaded task budget; the spending so far is kept. The
        book is made at start: budgets configured first by a reload need a restart."""
        if self.budgets is not None:
            counted_before = isinstance(self.budgets, SharedBudgets)
            if not counted_before and self.budgets.task_budget is None and config.budgets.task:
                log.warning("configuration: the new task budget counts spending from now on")
            self.budgets.task_budget = config.budgets.task
        elif budgets_configured(config):
            log.warning("configuration: budgets take effect at the next start")

    def reload_soon(self) -> None:
        """Reload in a task of its own (a signal handler's way in)."""
        task = asyncio.get_running_loop().create_task(self.reload())
        self._reloads.add(task)
        task.add_done_callback(self._reload_done)

    def _reload_done(self, task: asyncio.Task[ReloadResult]) -> None:
        self._reloads.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("configuration reload failed", exc_info=task.exception())

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self._started:
                await send_error(
                    send, GatewayError("the gateway is starting", code="starting", status=503)
                )
                return
            await self._route(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _route(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """The router, under a last catch-all: a fault that escapes it is still answered in
        OpenAI's shape (uvicorn's own answer would be a text/plain 500)."""
        try:
            await self.router(scope, receive, send)
        except Exception:
            error = internal_error(f"{scope.get('method')} {scope.get('path')}")
            # once the answer has begun, uvicorn refuses a second start: nothing more to say
            with contextlib.suppress(Exception):
                await send_error(send, error)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return


def _check_listening(host: str, old: GatewayConfig, new: GatewayConfig) -> None:
    """A reload may not take ``auth:`` away from a gateway listening off loopback (one
    started so with ``--insecure-no-auth`` had none to take)."""
    if listen_refusal(host, old.auth, False) is None:
        refusal = listen_refusal(host, new.auth, False)
        if refusal is not None:
            raise ConfigError(f"a reload cannot remove auth: {refusal}")


def _refused(reason: str) -> ReloadResult:
    log.error("configuration not reloaded, the running one is kept: %s", reason)
    return ReloadResult(False, reason)


async def _start(routes: Iterable[Route]) -> None:
    """Start what the profiles run themselves and learn their capabilities (a failure to
    learn them is not fatal: they are asked again on the next call)."""
    routes = list(routes)
    await asyncio.gather(*(r.start() for r in routes))
    upstreams = [r.upstream for r in routes]
    results = await asyncio.gather(*(u.capabilities() for u in upstreams), return_exceptions=True)
    for upstream, result in zip(upstreams, results, strict=True):
        if isinstance(result, BaseException):
            log.warning("model %s: capabilities not known yet: %s", upstream.name, result)


def upstream_limits(settings: UpstreamLimitsSettings) -> Limits:
    """``inference.upstream_limits`` in bytes, as the HTTP client and the relay apply them."""
    return Limits(
        body_bytes=int(settings.max_body_mib * (1 << 20)),
        inflated_bytes=int(settings.max_inflated_mib * (1 << 20)),
        event_bytes=int(settings.max_event_mib * (1 << 20)),
        stream_bytes=int(settings.max_stream_mib * (1 << 20)),
        captured_bytes=int(settings.max_captured_mib * (1 << 20)),
        head_bytes=int(settings.max_header_kib * (1 << 10)),
    )


def create_app(
    config: GatewayConfig,
    source: ConfigSource | None = None,
    listen_host: str = DEFAULT_LISTEN_HOST,
) -> GatewayApp:
    """The gateway as an ASGI application for ``config`` (read again from ``source`` on
    each reload), served on ``listen_host``: the address the server binds (``serve
    --host``); requests whose ``Host`` names it are the gateway's own (docs/security.md)."""
    return GatewayApp(config, source, listen_host)
