"""One call's whole record for the page: the ledger keeps each call's outcome, the call
log its detail too (attempts, adjustments, where a prompt stopped matching).

The newest records are kept in memory as they are submitted; an older one is looked
for in the call log, its rotated files included, off the event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path
from typing import Any

import orjson

from boundedcode_gateway.metering.calllog import log_files
from boundedcode_gateway.metering.records import CALL_LOG_ONLY, CallRecord

# records kept whole in memory for the page's detail view
RECENT_RECORDS = 2000


class RecentRecords:
    """The last ``limit`` published records by call id (a view of the record bus)."""

    def __init__(self, limit: int = RECENT_RECORDS) -> None:
        self._limit = limit
        self._records: OrderedDict[str, CallRecord] = OrderedDict()

    def remember(self, record: CallRecord) -> None:
        records = self._records
        records[record.call_id] = record
        if len(records) > self._limit:
            records.popitem(last=False)

    def get(self, call_id: str) -> dict[str, Any] | None:
        record = self._records.get(call_id)
        return record.to_dict() if record is not None else None

    def detail(self, call_id: str) -> dict[str, Any] | None:
        """What the call log has beyond the ledger's row, for a record kept here."""
        record = self._records.get(call_id)
        if record is None:
            return None
        return {name: getattr(record, name) for name in CALL_LOG_ONLY}


def logged_records(calls_path: Path, call_ids: Collection[str]) -> dict[str, dict[str, Any]]:
    """The call log's lines for ``call_ids``, by call id, newest file first (blocking: run
    it in a thread). Only lines that hold one of the ids are parsed."""
    wanted = set(call_ids)
    found: dict[str, dict[str, Any]] = {}
    needles = [orjson.dumps(call_id) for call_id in wanted]
    for file in reversed(log_files(calls_path)):
        try:
            f = file.open("rb")
        except FileNotFoundError:
            continue
        with f:
            for line in f:
                if not any(needle in line for needle in needles):
                    continue
                try:
                    value = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                call_id = value.get("call_id") if isinstance(value, dict) else None
                if call_id in wanted and call_id not in found:
                    found[call_id] = value
        if len(found) == len(wanted):
            break
    return found
