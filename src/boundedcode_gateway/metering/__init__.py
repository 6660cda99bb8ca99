"""Metering: every call becomes one line in the call log and one row in the ledger.

Owns the record, the bus it is published on, the two sinks and the one background
writer; it must not decide what a call's fields mean (the ingress and providers fill
them in).
"""

from boundedcode_gateway.metering.bus import RecordBus
from boundedcode_gateway.metering.records import CallRecord
from boundedcode_gateway.metering.writer import MeterWriter

__all__ = ["CallRecord", "MeterWriter", "RecordBus"]
