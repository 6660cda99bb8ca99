"""The gateway's Prometheus metrics (``GET /metrics``).

Each call is counted from its record, as the record bus publishes it (a view of
the bus, drained on the event loop, once per call, never per chunk), so the counts
are the ledger's. What is a state rather than an event (calls in flight, the
metering queue, managed-server restarts) is read when scraped.

Every label value is bounded: a model is a configured profile (any other name a
caller sent is ``other``), a purpose one of the documented ones (else ``other``),
an error code or resend cause one of the first ``MAX_CODES`` seen (then
``other``). A caller's task id is never a label.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from boundedcode_gateway.budgets.shared import OPERATIONS as BUDGET_OPERATIONS
from boundedcode_gateway.budgets.shared import SharedBudgets
from boundedcode_gateway.limits.limiter import CallLimits
from boundedcode_gateway.live_config import Route
from boundedcode_gateway.metering.records import OWN_RECORD_PURPOSES, CallRecord
from boundedcode_gateway.metering.writer import MeterWriter
from boundedcode_gateway.policy.cache_misses import REPAIR_PURPOSE
from boundedcode_gateway.state.database import OPERATIONS as STATE_OPERATIONS

PREFIX = "boundedcode_gateway"
OTHER = "other"
KNOWN_PURPOSES = frozenset(
    {
        "agent_turn",
        "condenser",
        "compaction",
        "planner",
        "contract",
        "ambiguity_check",
        "verification",
        REPAIR_PURPOSE,
        *OWN_RECORD_PURPOSES,
    }
)
# error codes and resend causes come from the gateway's tree, but an upstream's own code
# passes through: past this many distinct values a new one is counted as "other"
MAX_CODES = 100
CODE_FORM = re.compile(r"[a-z0-9_.-]{1,64}")
# seconds; answers of language models take from milliseconds to minutes
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TOKEN_KINDS = ("prompt", "cached", "evaluated", "completion")


class RouteTable(Protocol):
    """What the metrics read of the service: its routes and the profile names it knows."""

    def routes(self) -> Iterator[Route]:
        """The live routes, then those retiring."""
        ...

    def serves(self, model: str) -> bool:
        """Whether ``model`` names a live or retiring profile."""
        ...


class StateHealth(Protocol):
    """What the metrics read of a state database (``state:``)."""

    @property
    def up(self) -> bool: ...

    @property
    def unavailable(self) -> Mapping[str, int]:
        """Operations that went without the database, by operation."""
        ...


class PageViewers(Protocol):
    """What the metrics read of the page of calls' event stream (``ui/events.py``)."""

    @property
    def viewers(self) -> int:
        """Pages connected to the stream."""
        ...

    @property
    def dropped(self) -> int:
        """Events dropped for viewers too slow to read them, since the start."""
        ...


class _Series:
    """The metric children of one (model, purpose), made once: ``labels()`` is not free."""

    __slots__ = ("cost", "duration", "requests", "retried", "tokens", "ttft")

    def __init__(self, metrics: GatewayMetrics, model: str, purpose: str) -> None:
        self.duration = metrics.duration.labels(model, purpose)
        self.ttft = metrics.ttft.labels(model, purpose)
        self.tokens = tuple(metrics.tokens.labels(model, purpose, kind) for kind in TOKEN_KINDS)
        self.cost = metrics.cost.labels(model, purpose)
        self.retried = metrics.retried.labels(model, purpose)
        self.requests: dict[tuple[int, str], Counter] = {}


class GatewayMetrics:
    """The registry of one gateway (not the process-wide default: several may share a
    process) and the observer that counts each call's record into it."""

    def __init__(
        self,
        routes: RouteTable,
        writer: MeterWriter,
        events: PageViewers | None = None,
        state: StateHealth | None = None,
        limits: CallLimits | None = None,
        budgets: SharedBudgets | None = None,
    ) -> None:
        self._routes = routes
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Calls ended, by HTTP status and error code (empty when the call succeeded)",
            ["model", "purpose", "status", "code"],
            registry=r,
        )
        self.duration = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "Time from a call's arrival to its end",
            ["model", "purpose"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Time from a call's arrival to its first answer token",
            ["model", "purpose"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            f"{PREFIX}_tokens",
            "Tokens of the calls: prompt, cached (of the prompt), evaluated, completion",
            ["model", "purpose", "kind"],
            registry=r,
        )
        self.cost = Counter(
            f"{PREFIX}_cost_usd",
            "What the calls cost, in USD (calls of a priced profile)",
            ["model", "purpose"],
            registry=r,
        )
        self.retried = Counter(
            f"{PREFIX}_retried_requests",
            "Calls whose answer broke off and was sent again or continued",
            ["model", "purpose"],
            registry=r,
        )
        self.resends = Counter(
            f"{PREFIX}_resends",
            "Sends of a call after its first, by what ended the send before",
            ["model", "cause"],
            registry=r,
        )
        self.reloads = Counter(
            f"{PREFIX}_config_reloads",
            "Configuration reloads, applied or refused",
            ["result"],
            registry=r,
        )
        r.register(_StateCollector(routes, writer, events, state, limits, budgets))
        self._series: dict[tuple[str, str], _Series] = {}
        self._codes: set[str] = set()

    def exposition(self) -> tuple[bytes, str]:
        """The text format's body and content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def reloaded(self, applied: bool) -> None:
        self.reloads.labels("applied" if applied else "refused").inc()

    def observe(self, r: CallRecord) -> None:
        """Count one call from its record (as it is submitted)."""
        model = r.model_profile if self._routes.serves(r.model_profile) else OTHER
        purpose = r.purpose if r.purpose in KNOWN_PURPOSES else OTHER
        series = self._series.get((model, purpose))
        if series is None:
            series = self._series[(model, purpose)] = _Series(self, model, purpose)
        # only a failure has a code: the gateway's own work that gave way (``abandoned``)
        # is not counted as one
        code = self._code(r.error_code) if r.error_code and r.status == "error" else ""
        requests = series.requests.get((r.http_status, code))
        if requests is None:
            requests = self.requests.labels(model, purpose, str(r.http_status), code)
            series.requests[(r.http_status, code)] = requests
        requests.inc()
        if r.total_ms is not None:
            series.duration.observe(r.total_ms / 1000.0)
        if r.ttft_ms is not None:
            series.ttft.observe(r.ttft_ms / 1000.0)
        counts = (r.prompt_tokens, r.cached_tokens, r.evaluated_tokens, r.completion_tokens)
        for counter, count in zip(series.tokens, counts, strict=True):
            if count:
                counter.inc(count)
        if r.cost_usd:
            series.cost.inc(r.cost_usd)
        if r.retried:
            series.retried.inc()
        # every attempt but the last was followed by another send
        for attempt in r.attempt_log[:-1]:
            self.resends.labels(model, self._cause(attempt)).inc()

    def _cause(self, attempt: dict[str, object]) -> str:
        code = attempt.get("code")
        if isinstance(code, str) and code:
            return self._code(code)
        return self._code(f"http_{attempt.get('status')}")

    def _code(self, code: str) -> str:
        if code in self._codes:
            return code
        if len(self._codes) < MAX_CODES and CODE_FORM.fullmatch(code):
            self._codes.add(code)
            return code
        return OTHER


# each count of the slot files: its metric's name and help (docs/operations.md)
SLOT_FILE_COUNTS: tuple[tuple[str, str, str], ...] = (
    ("saves", "slot_saves", "Conversations' slots saved to their slot files"),
    ("save_failures", "slot_save_failures", "Slot saves that failed (logged)"),
    ("restores", "slot_restores", "Slot files restored into a slot before a call"),
    (
        "refused",
        "slot_restores_refused",
        "Slot files not restored: cut, changed, not slot files, of another model or "
        "refused by the server",
    ),
    (
        "ineffective",
        "slot_restores_ineffective",
        "Calls whose slot file bought nothing (refused, evaluated again, or a changed history)",
    ),
)


class _StateCollector(Collector):
    """What is read when scraped: calls in flight, managed-server restarts, the metering
    queue and its losses, the ledger's buffer, a state database's health."""

    def __init__(
        self,
        routes: RouteTable,
        writer: MeterWriter,
        events: PageViewers | None,
        state: StateHealth | None,
        limits: CallLimits | None = None,
        budgets: SharedBudgets | None = None,
    ) -> None:
        self._routes = routes
        self._writer = writer
        self._events = events
        self._state = state
        self._call_limits = limits
        self._budgets = budgets

    def _limits(self) -> Iterable[Metric]:
        """The rate and concurrency limits' refusals and places, the shared budgets'
        database and the calls sent unreserved while it was away."""
        limits = self._call_limits
        if limits is not None:
            refused = CounterMetricFamily(
                f"{PREFIX}_rate_limited_calls",
                "Calls refused by a rate limit (window: requests or tokens in a window; "
                "in_flight: no place in time, or the queue full)",
                labels=["limit"],
            )
            refused.add_metric(["window"], limits.counts.rate_refused)
            refused.add_metric(["in_flight"], limits.counts.in_flight_refused)
            yield refused
            yield CounterMetricFamily(
                f"{PREFIX}_rate_limits_uncounted_calls",
                "Calls admitted uncounted while the rate limits' shared database did not "
                "answer (rate_limits.when_store_down: fail_open)",
                value=limits.counts.uncounted,
            )
            held = GaugeMetricFamily(
                f"{PREFIX}_limited_calls_in_flight",
                "Calls holding a place of a concurrency limit, by the kind of holder",
                labels=["holder"],
            )
            waiting = GaugeMetricFamily(
                f"{PREFIX}_limited_calls_waiting",
                "Calls waiting for a place of a concurrency limit, by the kind of holder",
                labels=["holder"],
            )
            for kind in ("caller", "task", "profile"):
                places = [p for h, p in limits.in_flight.items() if h[0] == kind]
                held.add_metric([kind], sum(p.in_flight for p in places))
                waiting.add_metric([kind], sum(p.waiting for p in places))
            yield held
            yield waiting
        budgets = self._budgets
        if budgets is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_budgets_database_up",
                "1 while the database of the budgets several gateways share answers",
                value=1 if budgets.database.up else 0,
            )
            unavailable = CounterMetricFamily(
                f"{PREFIX}_budgets_unavailable_operations",
                "Reservations (reserve) and renewals (renew) that went without the budgets' "
                "database",
                labels=["operation"],
            )
            for operation in BUDGET_OPERATIONS:
                unavailable.add_metric([operation], budgets.database.unavailable.get(operation, 0))
            yield unavailable
            yield CounterMetricFamily(
                f"{PREFIX}_budgets_unreserved_calls",
                "Calls sent without a reservation while the budgets' database did not answer "
                "(budgets.when_store_down: fail_open)",
                value=budgets.unreserved,
            )

    def _slot_files(self) -> Iterable[Metric]:
        """The slot files' counts per profile, and the store's size."""
        families = {
            field: CounterMetricFamily(f"{PREFIX}_{name}", text, labels=["model"])
            for field, name, text in SLOT_FILE_COUNTS
        }
        seen: set[str] = set()
        totals = None
        for route in self._routes.routes():
            files = route.fleet.slot_files if route.fleet is not None else None
            if files is None or route.name in seen:  # the live one comes first
                continue
            seen.add(route.name)
            totals = files.store.totals()
            for field, family in families.items():
                family.add_metric([route.name], getattr(files.counts, field))
        if totals is None:
            return
        yield from families.values()
        yield GaugeMetricFamily(
            f"{PREFIX}_slot_files_bytes",
            "Bytes of the slot files on disk (prompt_cache.disk_mib at most)",
            value=totals.bytes,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_slot_files", "Slot files on disk, one a conversation", value=totals.files
        )

    def collect(self) -> Iterable[Metric]:
        in_flight = GaugeMetricFamily(
            f"{PREFIX}_requests_in_flight",
            "Calls begun and not yet ended (on a profile's live or retiring upstream)",
            labels=["model"],
        )
        restarts = CounterMetricFamily(
            f"{PREFIX}_llama_server_restarts",
            "Times a profile's managed llama-server was started again after it exited",
            labels=["model"],
        )
        calls: dict[str, int] = {}
        restarted: dict[str, int] = {}
        for route in self._routes.routes():
            calls[route.name] = calls.get(route.name, 0) + route.in_flight
            count = route.fleet.restarts() if route.fleet is not None else None
            if count is not None and route.name not in restarted:  # the live one comes first
                restarted[route.name] = count
        for name, count in calls.items():
            in_flight.add_metric([name], count)
        for name, count in restarted.items():
            restarts.add_metric([name], count)
        w = self._writer
        yield in_flight
        yield restarts
        yield from self._slot_files()
        yield GaugeMetricFamily(
            f"{PREFIX}_metering_queue_depth",
            "Call records waiting for the meter writer",
            value=w.queued,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_metering_dropped_records",
            "Call records refused by the meter writer (queue full, or closed)",
            value=w.dropped,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_metering_written_records",
            "Call records written to the call log or the ledger",
            value=w.written,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_metering_errors",
            "Failed writes of the call log or the ledger",
            value=w.errors,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_metering_ledger_buffered_records",
            "Call records a PostgreSQL ledger that went away has not taken yet, kept to be "
            "written once it is back",
            value=w.ledger_buffered,
        )
        yield CounterMetricFamily(
            f"{PREFIX}_metering_ledger_dropped_records",
            "Call records the ledger lost while it was away: the oldest, its buffer full",
            value=w.ledger_dropped,
        )
        state = self._state
        if state is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_state_database_up",
                "1 while the state database (state:) answers, 0 from a failure until it answers",
                value=1 if state.up else 0,
            )
            unavailable = CounterMetricFamily(
                f"{PREFIX}_state_unavailable_operations",
                "Operations of calls that went without the state database (failed, or not "
                "tried during an outage): read_reasoning, write_reasoning, history, sweep",
                labels=["operation"],
            )
            for operation in STATE_OPERATIONS:
                unavailable.add_metric([operation], state.unavailable.get(operation, 0))
            yield unavailable
        yield from self._limits()
        events = self._events
        if events is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_ui_viewers",
                "Pages of calls connected to the event stream",
                value=events.viewers,
            )
            yield CounterMetricFamily(
                f"{PREFIX}_ui_dropped_events",
                "Events of the page of calls dropped for viewers too slow to read them",
                value=events.dropped,
            )
