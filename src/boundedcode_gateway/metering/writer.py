"""The one background writer: takes call records off the request path and writes them.

The record bus's durable subscriber (``bus.py``): it is handed each published record.

Owns the queue, the writer thread and the ledger connection (opened in that thread).
``submit`` runs on the event loop and must never block or raise; a failing sink is
logged and counted, and must not stop the other sink or the thread. A record a sink
cannot hold (a value out of its range) is set aside, logged, without the rest of its
batch. With ``sync``, ``submit`` hands back a future the caller's answer waits on:
done once the record's batch is written.

A ledger that can come back (PostgreSQL) and fails is not given up: the records it could
not take are kept in a bounded backlog (``backlog.py``), in order, while the call log goes
on being written; the thread reconnects with backoff and writes them once it can. A
batch kept so counts as done: its futures are released, no answer waits for the database.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import TypeVar

from boundedcode_gateway.locations import LedgerLocation, describe
from boundedcode_gateway.metering.backlog import LedgerBacklog, Pending
from boundedcode_gateway.metering.calllog import append_lines, rotate
from boundedcode_gateway.metering.ledgers import LedgerStore, ledger_at
from boundedcode_gateway.metering.records import CallRecord, Rejected

T = TypeVar("T")

logger = logging.getLogger(__name__)

BATCH_MAX = 256
# how long the thread waits after the first record of a batch for more to arrive
BATCH_WINDOW_S = 0.02
# Under sustained overload every submit drops; log the first drop and then every Nth.
DROP_LOG_EVERY = 1000
# records a ledger that went away may leave waiting (`metering.ledger_buffer_records`)
LEDGER_BUFFER_RECORDS = 100_000

# None in the queue tells the thread to stop; it is queued after every record
# submitted before close(), so those are all written first.
_Item = CallRecord | None


class MeterWriter:
    """Writes each submitted record to the call log and the ledger, in batches.

    Counters: ``written`` records that reached at least one sink, ``dropped`` records
    refused (queue full or writer closed), ``errors`` sink failures (one per failed
    batch per sink, plus a failure to open the ledger), ``set_aside`` records a sink
    could not hold (one per record per sink); ``queued`` records waiting. For a ledger
    that reconnects: ``ledger_buffered`` records waiting for it to come back,
    ``ledger_dropped`` records it lost (the buffer full, the oldest first; or still
    waiting when the writer stopped).
    """

    def __init__(
        self,
        calls_path: Path,
        ledger: LedgerLocation,
        max_queue: int = 100_000,
        enabled: bool = True,
        sync: bool = False,
        rotate_bytes: int | None = None,
        rotated_files: int = 4,
        ledger_buffer_records: int = LEDGER_BUFFER_RECORDS,
    ) -> None:
        self.calls_path = calls_path
        self.ledger_location = ledger
        # the call log is rotated once this size is reached, `rotated_files` of it kept
        self.rotate_bytes = rotate_bytes
        self.rotated_files = rotated_files
        # disabled: every record is discarded on submit and no thread runs
        self.enabled = enabled
        # sync: no batch window, and a future per record for the answer to wait on
        self.sync = sync
        self.written = 0
        self.dropped = 0
        self.errors = 0
        self.set_aside = 0
        self._durable: dict[str, Future[None]] = {}  # call id → its future, when sync
        self._queue: queue.Queue[_Item] = queue.Queue(maxsize=max_queue)
        self._lock = threading.Lock()
        self._progress = threading.Condition(self._lock)
        self._accepted = 0  # records put on the queue
        self._done = 0  # records the thread has finished with, written or not
        self._closed = False
        self._thread: threading.Thread | None = None
        self._failing: set[str] = set()  # sinks whose last write failed
        self._backlog = LedgerBacklog(ledger_buffer_records)

    @property
    def queued(self) -> int:
        """Records accepted and not yet written (or given up)."""
        return self._accepted - self._done

    @property
    def ledger_buffered(self) -> int:
        """Records the ledger could not take yet, kept to be written once it can."""
        return len(self._backlog)

    @property
    def ledger_dropped(self) -> int:
        """Records the ledger lost while it was away: the oldest, once the buffer was full."""
        return self._backlog.dropped

    def start(self) -> None:
        """Start the writer thread; starting twice is harmless."""
        with self._lock:
            if self._closed:
                raise RuntimeError("MeterWriter is closed")
        if self.enabled:
            self._start_thread()

    def submit(self, record: CallRecord) -> Future[None] | None:
        """Queue a record for writing; never blocks, never raises (drops when full).

        When ``sync``, the future done once the record's batch has been written (or its
        sinks have failed, which is logged); None for a record not queued, or not sync.
        """
        if not self.enabled:
            return None
        with self._lock:
            if not self._closed:
                durable: Future[None] | None = None
                if self.sync:
                    durable = Future()
                    self._durable[record.call_id] = durable
                try:
                    self._queue.put_nowait(record)
                except queue.Full:
                    if durable is not None:
                        del self._durable[record.call_id]
                else:
                    self._accepted += 1
                    return durable
            self.dropped += 1
            dropped, closed = self.dropped, self._closed
        if dropped == 1 or dropped % DROP_LOG_EVERY == 0:
            reason = "the meter writer is closed" if closed else "the meter queue is full"
            logger.warning(
                "call record %s dropped: %s (%d dropped so far)", record.call_id, reason, dropped
            )
        return None

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record submitted so far is written; False on timeout."""
        with self._progress:
            target = self._accepted
            if self._done >= target:
                return True
            if self._thread is None or not self._thread.is_alive():
                return False
            return self._progress.wait_for(lambda: self._done >= target, timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Write everything still queued, close the ledger and stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._thread is None and self._accepted == 0:
                return
        # Records already queued must still be written, even if start() was never called.
        thread = self._start_thread()
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            logger.error("meter writer did not take the stop signal within %.1fs", timeout)
            return
        thread.join(timeout)
        if thread.is_alive():
            logger.error("meter writer did not finish within %.1fs", timeout)

    def _start_thread(self) -> threading.Thread:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="meter-writer", daemon=True)
                self._thread.start()
            return self._thread

    def _run(self) -> None:
        ledger = self._open_ledger()
        try:
            stop = False
            while not stop:
                batch, stop = self._next_batch()
                if batch:
                    self._write(batch, ledger)
                if ledger is not None and self._backlog.due(time.monotonic()):
                    self._retry_ledger(ledger)
            if ledger is not None and self._backlog:
                self._retry_ledger(ledger)  # one last try before the records are lost
                self._give_up_backlog()
        finally:
            if ledger is not None:
                try:
                    ledger.close()
                except Exception:
                    logger.exception("meter writer: closing the ledger failed")

    def _next_batch(self) -> tuple[list[CallRecord], bool]:
        """Block for one item, then take whatever else is queued, up to BATCH_MAX. While a
        ledger that went away is waited for, wake up when its next try is due."""
        batch: list[CallRecord] = []
        try:
            item = self._queue.get(timeout=self._backlog.wait(time.monotonic()))
        except queue.Empty:
            return batch, False
        if item is not None and not self.sync:
            # Let a burst gather: one append and one ledger transaction for many calls
            # instead of one each, and no wake-up of this thread per call. A sleep,
            # not get(timeout=...), which would wake it on every submit. (Sync: answers
            # wait on the write; what queued during the last write is the batch.)
            time.sleep(BATCH_WINDOW_S)
        while item is not None:
            batch.append(item)
            if len(batch) >= BATCH_MAX:
                return batch, False
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return batch, False
        return batch, True

    def _open_ledger(self) -> LedgerStore | None:
        ledger = ledger_at(self.ledger_location)

        def opened() -> LedgerStore:
            ledger.open()
            return ledger

        if self._attempt("ledger", opened) is not None:
            return ledger
        if ledger.reconnects:
            self._backlog.failed(time.monotonic())
            logger.error(
                "ledger %s is not reachable; records wait for it (up to %d), the call log "
                "is written",
                describe(self.ledger_location),
                self._backlog.bound,
            )
            return ledger
        logger.error(
            "ledger %s is not written; the call log still is", describe(self.ledger_location)
        )
        return None

    def _write(self, batch: Sequence[CallRecord], ledger: LedgerStore | None) -> None:
        if self.rotate_bytes is not None:
            self._attempt("call log rotation", self._rotate_when_full)
        logged = self._attempt("call log", lambda: append_lines(self.calls_path, batch))
        in_log = self._held("call log", batch, logged)
        stored = self._store(batch, ledger, in_log)
        in_ledger = self._held("ledger", batch, stored)
        with self._progress:
            self.written += sum(1 for r in batch if id(r) in in_log or id(r) in in_ledger)
            self._done += len(batch)
            durable = [self._durable.pop(r.call_id, None) for r in batch] if self.sync else []
            self._progress.notify_all()
        for future in durable:
            # An answer that stopped waiting (its caller left) has cancelled its future;
            # setting a result then would raise, here, and end the thread.
            if future is not None and future.set_running_or_notify_cancel():
                future.set_result(None)

    def _held(
        self, sink: str, batch: Sequence[CallRecord], rejected: list[Rejected] | None
    ) -> set[int]:
        """The records (by identity) the sink holds; those it set aside are logged."""
        if rejected is None:
            return set()
        for record, exc in rejected:
            self._set_aside(sink, record, exc)
        left_out = {id(record) for record, _ in rejected}
        return {id(r) for r in batch if id(r) not in left_out}

    def _store(
        self, batch: Sequence[CallRecord], ledger: LedgerStore | None, in_log: set[int]
    ) -> list[Rejected] | None:
        """Write the batch to the ledger: what it could not hold, or None when it holds none
        of it yet (a failure, or kept in the backlog for a ledger that went away)."""
        if ledger is None:
            return None
        if not ledger.reconnects:
            return self._attempt("ledger", lambda: ledger.insert(batch))
        if not self._backlog.failing:
            stored = self._attempt("ledger", lambda: ledger.insert(batch))
            if stored is not None:
                return stored
            self._backlog.failed(time.monotonic())
        # behind the records already kept: the ledger gets them in the order they came
        dropped = self._backlog.keep(Pending(r, id(r) in in_log) for r in batch)
        if dropped:
            self._log_buffer_drops(dropped)
        return None

    def _retry_ledger(self, ledger: LedgerStore) -> None:
        """Reconnect and write what was kept, oldest first, a batch at a time; a batch
        written is released even when a later one fails."""
        kept = len(self._backlog)

        def reconnect_and_write() -> int:
            ledger.close()
            ledger.open()
            while self._backlog:
                chunk = self._backlog.head(BATCH_MAX)
                rejected = ledger.insert([p.record for p in chunk])
                self._backlog.release(len(chunk))
                for record, exc in rejected:
                    self._set_aside("ledger", record, exc)
                left_out = {id(record) for record, _ in rejected}
                late = sum(1 for p in chunk if not p.counted and id(p.record) not in left_out)
                with self._lock:
                    self.written += late
            return kept

        if self._attempt("ledger", reconnect_and_write) is None:
            self._backlog.failed(time.monotonic())
            return
        self._backlog.succeeded()
        if kept:
            logger.warning("meter writer: %d records kept for the ledger are written", kept)

    def _give_up_backlog(self) -> None:
        lost = self._backlog.give_up()
        if lost:
            logger.error(
                "meter writer: %d records never reached the ledger %s (%d in all); the call "
                "log has them",
                lost,
                describe(self.ledger_location),
                self._backlog.dropped,
            )

    def _log_buffer_drops(self, dropped: Sequence[Pending]) -> None:
        total = self._backlog.dropped
        # the first drop of a run, then every DROP_LOG_EVERY-th
        if total == len(dropped) or total // DROP_LOG_EVERY != (total - len(dropped)) // (
            DROP_LOG_EVERY
        ):
            logger.warning(
                "meter writer: the ledger buffer is full (%d records): the oldest dropped, "
                "%s last (%d dropped so far)",
                self._backlog.bound,
                dropped[-1].record.call_id,
                total,
            )

    def _rotate_when_full(self) -> None:
        assert self.rotate_bytes is not None
        try:
            size = self.calls_path.stat().st_size
        except FileNotFoundError:
            return
        if size >= self.rotate_bytes:
            rotate(self.calls_path, self.rotated_files)
            logger.info("call log rotated: %s is now %s.1", self.calls_path, self.calls_path.name)

    def _set_aside(self, sink: str, record: CallRecord, exc: Exception) -> None:
        """One record the sink cannot hold: logged whole, so it can be entered by hand."""
        with self._lock:
            self.set_aside += 1
        # the standard json writes integers of any size, where orjson stops at 64 bits
        whole = json.dumps(asdict(record), default=str)
        logger.error(
            "meter writer: %s cannot hold call %s (%s): %s", sink, record.call_id, exc, whole
        )

    def _attempt(self, sink: str, action: Callable[[], T]) -> T | None:
        """Run one sink operation; log and count a failure instead of raising (None)."""
        try:
            result = action()
        except Exception:
            with self._lock:
                self.errors += 1
            # The traceback once per run of failures, not once per batch.
            repeated = sink in self._failing
            self._failing.add(sink)
            logger.error("meter writer: %s failed", sink, exc_info=not repeated)
            return None
        if sink in self._failing:
            self._failing.discard(sink)
            logger.warning("meter writer: %s works again", sink)
        return result
