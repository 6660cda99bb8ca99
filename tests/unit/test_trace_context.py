"""A call's place in its trace: the caller's traceparent read as the W3C text says, the
sampling decision the SDK's, and whether the gateway traces at all."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased

from boundedcode_gateway.config import ObservabilitySettings
from boundedcode_gateway.trace_context import TracePolicy, policy_of, read_traceparent

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_a_valid_traceparent_names_its_trace_parent_and_flag() -> None:
    assert read_traceparent(VALID) == (
        "0af7651916cd43dd8448eb211c80319c",
        "b7ad6b7169203331",
        True,
    )
    assert read_traceparent(VALID[:-2] + "00") == (
        "0af7651916cd43dd8448eb211c80319c",
        "b7ad6b7169203331",
        False,
    )


def test_an_invalid_traceparent_is_ignored() -> None:
    for bad in (
        None,
        "",
        "garbage",
        VALID.upper(),  # upper-case hex is not the header's form
        "ff" + VALID[2:],  # the forbidden version
        VALID + "-extra",  # version 00 has no more fields
        "00-" + "0" * 32 + "-b7ad6b7169203331-01",  # an all-zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01",
    ):
        assert read_traceparent(bad) is None, bad
    # a later version may add fields after a dash
    assert read_traceparent("01" + VALID[2:] + "-more") is not None


def test_the_call_is_a_child_of_the_callers_span_and_keeps_its_decision() -> None:
    policy = TracePolicy(ratio=0.0)
    ctx = policy.start(VALID, "vendor=abc")
    assert ctx.trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert ctx.parent_id == "b7ad6b7169203331" and ctx.span_id != ctx.parent_id
    assert ctx.sampled is True and ctx.state == "vendor=abc"
    assert ctx.header(ctx.span_id) == f"00-{ctx.trace_id}-{ctx.span_id}-01"
    unsampled = policy.start(VALID[:-2] + "00", None)
    assert unsampled.sampled is False and unsampled.header("1" * 16).endswith("-00")


def test_a_trace_begun_here_has_fresh_ids() -> None:
    a, b = TracePolicy().start(None, "ignored=without-parent"), TracePolicy().start(None, None)
    assert a.trace_id != b.trace_id and len(a.trace_id) == 32 and len(a.span_id) == 16
    assert a.parent_id is None and a.state is None and a.sampled is True
    child = a.child()
    assert child.trace_id == a.trace_id and child.parent_id == a.span_id


@given(st.integers(1, (1 << 128) - 1), st.floats(0.0, 1.0))
def test_the_ratio_decision_is_the_sdks(trace_id: int, ratio: float) -> None:
    sdk = ParentBased(TraceIdRatioBased(ratio)).should_sample(None, trace_id, "call")
    ours = TracePolicy(ratio=ratio).sampled(f"{trace_id:032x}")
    assert ours == (sdk.decision is Decision.RECORD_AND_SAMPLE)


def test_tracing_is_on_with_an_endpoint_in_the_file_or_the_environment() -> None:
    off = ObservabilitySettings()
    assert policy_of(off, {}) is None
    assert policy_of(off, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}) is not None
    assert policy_of(ObservabilitySettings(endpoint="http://127.0.0.1:4318"), {}) is not None
    on = ObservabilitySettings(enabled=True)
    assert policy_of(on, {"OTEL_SDK_DISABLED": "true"}) is None
    assert policy_of(on, {"OTEL_TRACES_EXPORTER": "none"}) is None


def test_the_sampler_comes_from_the_file_else_the_environment() -> None:
    on = ObservabilitySettings(enabled=True)
    env = {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    assert policy_of(on, env) == TracePolicy(0.25, parent_based=False)
    env = {"OTEL_TRACES_SAMPLER": "parentbased_always_off"}
    assert policy_of(on, env) == TracePolicy(0.0, parent_based=True)
    file = ObservabilitySettings(enabled=True, sampling=0.5, capture_content=True)
    assert policy_of(file, env) == TracePolicy(0.5, True, True, True)
