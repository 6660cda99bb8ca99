"""One test per provider wording of "the prompt does not fit", and the fallback's limits."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boundedcode_gateway.policy import context_overflow
from boundedcode_gateway.policy.context_overflow import (
    CONTEXT_OVERFLOW_PATTERNS,
    KNOWN_WORDINGS,
    is_context_overflow,
)

# (who says it, what it says): each as the provider words it, with its numbers
WORDINGS: list[tuple[str, str]] = [
    (
        "llama.cpp",
        "request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it",
    ),
    (
        "llama.cpp before 2025",
        "the request exceeds the available context size. try increasing the context size or "
        "enable context shift",
    ),
    (
        "llama.cpp, unsplittable task",
        "input (9000 tokens) is larger than the max context size (8192 tokens). skipping",
    ),
    (
        "OpenAI",
        "This model's maximum context length is 8192 tokens. However, your messages resulted in "
        "9000 tokens. Please reduce the length of the messages.",
    ),
    (
        "DeepSeek",
        "This model's maximum context length is 65536 tokens. However, you requested 69648 "
        "tokens (69648 in the messages, 0 in the completion). Please reduce the length of the "
        "messages or completion.",
    ),
    (
        "OpenRouter",
        "This endpoint's maximum context length is 128000 tokens. However, you requested about "
        "131000 tokens (130000 of text input, 1000 in the output).",
    ),
    (
        "Aphrodite",
        "This model's maximum context length is 4096 tokens. However, your request has 5000 "
        "input tokens. Please reduce the length of the input messages.",
    ),
    (
        "OpenAI GPT-5",
        "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in "
        "300007 tokens. Please reduce the length of the messages.",
    ),
    (
        "OpenAI Responses",
        "Your input exceeds the context window of this model. Please adjust your input and try "
        "again.",
    ),
    ("Groq", "Please reduce the length of the messages or completion."),
    (
        "Cerebras",
        "Please reduce the length of the messages or completion. Current length is 42328 while "
        "limit is 40000",
    ),
    (
        "vLLM",
        "You passed 12289 input tokens and requested 4096 output tokens. However, the model's "
        "context length is only 16384 tokens, resulting in a maximum input length of 12288 "
        "tokens. Please reduce the length of the input prompt.",
    ),
    (
        "vLLM V1 engine",
        "The decoder prompt (length 8825) is longer than the maximum model length of 8192. Make "
        "sure that `max_model_len` is no smaller than the number of text tokens.",
    ),
    ("Anthropic", "prompt is too long: 208656 tokens > 200000 maximum"),
    (
        "Anthropic, with max_tokens",
        "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, "
        "decrease input length or `max_tokens` and try again",
    ),
    ("Fireworks", "The prompt is too long: 262377, model maximum context length: 262143"),
    ("Amazon Bedrock", "Input is too long for requested model."),
    (
        "Gemini",
        "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
    ),
    (
        "SGLang, Together",
        "The input (61709 tokens) is longer than the model's context length (40960 tokens).",
    ),
    ("SGLang", "Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens)."),
    (
        "SGLang, prompt and answer",
        "Requested token count exceeds the model's maximum context length of 32768 tokens. You "
        "requested a total of 34000 tokens: 30000 tokens from the input messages and 4000 tokens "
        "for the completion. Please reduce the number of tokens in the input messages or the "
        "completion to fit within the limit.",
    ),
    (
        "Baseten via OpenRouter",
        "Provider returned error: Input length 131393 exceeds the maximum allowed input length "
        "of 131040 tokens.",
    ),
    (
        "TensorRT-LLM, PyTorch backend",
        "The sum of prompt length (72417.0), query length (0) should not exceed max_num_tokens "
        "(69632)",
    ),
    (
        "TensorRT-LLM, TensorRT backend",
        "The sum of prompt length (4000) and query length (0) max_tokens (2048) should not "
        "exceed max_seq_len (4096)",
    ),
    (
        "LMDeploy",
        "Input length (9000) must be smaller than the model context length (8192).",
    ),
    ("LMDeploy, engine", "The request exceeds the model context length."),
    (
        "MLC LLM",
        "Request prompt has 9000 tokens in total, larger than the model input length limit 8192.",
    ),
    (
        "Mistral",
        "Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 "
        "maximum context length",
    ),
    (
        "text-generation-inference",
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
        "Given: 4000 `inputs` tokens and 500 `max_new_tokens`",
    ),
    (
        "text-generation-inference, input alone",
        "Input validation error: `inputs` must have less than 4096 tokens. Given: 5000",
    ),
    (
        "xAI",
        "This model's maximum prompt length is 131072 but the request contains 140000 tokens.",
    ),
    (
        "Ollama",
        "the prompt is longer than the context length currently available to the model; shorten "
        "the prompt, adjust the context length in settings, or use a model with a longer context "
        "length",
    ),
    ("Ollama, embeddings", "the input length exceeds the context length"),
    (
        "Ollama MLX runner",
        "input length (9000 tokens) exceeds the model's maximum context length (8192 tokens)",
    ),
    ("ollama.com", "prompt too long; exceeded max context length by 4021 tokens"),
    (
        "LM Studio",
        "The number of tokens to keep from the initial prompt is greater than the context length "
        "(n_keep: 5228 >= n_ctx: 4096). Try to load the model with a larger context length, or "
        "provide a shorter input.",
    ),
    ("Moonshot Kimi", "Input token length too long"),
    (
        "Moonshot Kimi, with max_tokens",
        "Invalid request: Your request exceeded model token limit: 262144 (requested: 269030)",
    ),
    ("MiniMax", "invalid params, context window exceeds limit (2013)"),
    ("Qwen DashScope", "Range of input length should be [1, 30720]"),
    ("Baidu Qianfan", "Prompt tokens too long"),
    (
        "SiliconFlow",
        "number of input tokens (83121) have exceeded max_prompt_tokens (65536) limit.",
    ),
    (
        "LiteLLM proxy",
        "litellm.ContextWindowExceededError: litellm.BadRequestError: Hosted_vllmException - "
        "Input length 9000 exceeds model limit. Received Model Group=local",
    ),
    ("Portkey", "anthropic error: prompt is too long: 210000 tokens > 200000 maximum"),
]


@pytest.mark.parametrize(("who", "message"), WORDINGS, ids=[w for w, _ in WORDINGS])
def test_each_wording_is_recognised(who: str, message: str) -> None:
    # no status: the table alone decides, whatever status the wording arrives with
    assert is_context_overflow(message, None, None), who


def test_every_table_entry_has_a_wording_here() -> None:
    # an entry nobody tests could match nothing at all
    for source, pattern in KNOWN_WORDINGS:
        assert any(pattern.search(m) for _, m in WORDINGS), source


@pytest.mark.parametrize(
    ("error_type", "code"),
    [
        ("exceed_context_size_error", 400),  # llama.cpp
        ("context_exceeded", None),  # ds4
        ("invalid_request_error", "context_length_exceeded"),  # OpenAI, Groq, Azure
        ("invalid_request_error", "tokens_too_long"),  # Baidu Qianfan
    ],
)
def test_type_and_code_are_enough(error_type: str, code: object) -> None:
    assert is_context_overflow("x", error_type, code)


# Wordings in no table, which the fallback catches on a 400
FALLBACK_OVERFLOWS = [
    "prompt token count of 150000 exceeds the limit of 128000",
    "Input of 9000 tokens exceeds this deployment's limit of 8192 tokens",
    "The conversation is too long for this model: 40,000 tokens, at most 32,768 allowed",
    "messages total 9001 tokens, more than the 8192 the model accepts",
]


@pytest.mark.parametrize("message", FALLBACK_OVERFLOWS)
def test_the_fallback_catches_an_unlisted_wording_on_a_400(message: str) -> None:
    assert is_context_overflow(message, "invalid_request_error", None, 400)


@pytest.mark.parametrize("status", [None, 413, 422, 429, 500])
def test_the_fallback_is_for_a_400_only(status: int | None) -> None:
    assert not is_context_overflow(FALLBACK_OVERFLOWS[0], None, None, status)


ORDINARY_400S = [
    # bad parameter
    "Unrecognized request argument supplied: top_k",
    "Invalid value for 'temperature': expected a number between 0 and 2, got 3.",
    "Range of max_tokens should be [1, 8192]",
    # bad schema
    "Invalid schema for function 'read_file': 'path' is not of type 'object'.",
    "response_format.json_schema: Additional properties are not allowed ('foo' was unexpected)",
    "Failed to parse tool call arguments as JSON: bad",
    # the answer's limit alone
    "max_tokens is too large: 100000. This model supports at most 16384 completion tokens, "
    "whereas you provided 100000.",
    "max_output_tokens=140000cannot be greater than max_total_tokens=max_total_tokens=131072. "
    "Please request fewer output tokens.",
    "The maximum tokens you requested exceeds the model limit of 2048. Try again with a maximum "
    "tokens value that is lower than 2048.",
    "Input validation error: `max_new_tokens` must be <= 4096. Given: 8000",
    # rates and quotas
    "Rate limit reached for gpt-5.1 in organization org-abc on tokens per min (TPM): "
    "Limit 30000, Used 20000, Requested 15000.",
    "Request too large for model `llama3-70b-8192` in organization `org_1` service tier "
    "`on_demand` on tokens per minute (TPM): Limit 6000, Requested 7000, please reduce your "
    "message size and try again.",
    "You exceeded your current quota of 1000000 input tokens per day.",
    "ThrottlingException: Too many tokens, please wait before trying again.",
    # sizes that are not the context
    "Invalid 'messages[2].content': string too long. Expected a string with maximum length "
    "10485760, but got a string with length 12000000 instead.",
    "Prompt too long (max 8000 chars)",
    "total message size 3000000 exceeds limit 2097152",
    "",
]


@pytest.mark.parametrize("message", ORDINARY_400S)
def test_ordinary_400s_are_not_overflow(message: str) -> None:
    assert not is_context_overflow(message, "invalid_request_error", None, 400)


_tokens = st.integers(min_value=1, max_value=10_000_000)


@given(limit=_tokens, used=_tokens, requested=_tokens, model=st.from_regex(r"[a-z0-9.-]{1,20}"))
def test_a_rate_limit_is_never_overflow_whatever_its_numbers(
    limit: int, used: int, requested: int, model: str
) -> None:
    message = (
        f"Rate limit reached for {model} on input tokens per minute: Limit {limit}, "
        f"Used {used}, Requested {requested}. The prompt exceeds what is left."
    )
    assert not is_context_overflow(message, "rate_limit_error", None, 400)


@given(
    prefix=st.text(max_size=40),
    suffix=st.text(max_size=40),
    index=st.integers(min_value=0, max_value=len(WORDINGS) - 1),
)
def test_a_wording_is_found_inside_a_proxys_wrapping(prefix: str, suffix: str, index: int) -> None:
    # proxies put their own words around the upstream's ("openai error: ", "... Received ...")
    _, message = WORDINGS[index]
    assert is_context_overflow(f"{prefix}{message}{suffix}", None, None)


@given(message=st.text(alphabet=st.characters(exclude_categories=["Nd"]), max_size=200))
def test_the_fallback_needs_a_number(message: str) -> None:
    # "a number of tokens present": without a digit only the table can decide
    table = any(p.search(message) for _, p in KNOWN_WORDINGS)
    assert is_context_overflow(message, None, None, 400) == table


# -- the time a hostile message costs

# messages of digit runs, in the shapes that made the fallback's token count quadratic
ADVERSARIAL = {
    "digits": "The prompt exceeds " + "1" * 200_000,
    "digits and commas": "The prompt exceeds " + "1," * 100_000,
    "commas": "The prompt exceeds 1" + "," * 200_000,
    "digits and spaces": "The prompt exceeds " + "1 " * 100_000,
    "repeated wording head": "input token count " * 12_000,
}


def _best_of(runs: int, call: Callable[[], object]) -> float:
    """The shortest of ``runs`` timings: a loaded machine only ever adds to one."""
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


@pytest.mark.parametrize("length", [4_000, 100_000])
@pytest.mark.parametrize("shape", list(ADVERSARIAL))
def test_a_long_message_of_digit_runs_is_read_at_the_cost_of_plain_text(
    shape: str, length: int
) -> None:
    # 4,000 digits held the event loop for 0.2 s, 100,000 for minutes
    message = ADVERSARIAL[shape][:length]
    plain = "The prompt exceeds " + "x" * (length - 19)
    assert not is_context_overflow(message, None, None, 400)
    took = _best_of(5, lambda: is_context_overflow(message, None, None, 400))
    linear = _best_of(5, lambda: is_context_overflow(plain, None, None, 400))
    assert took < 0.05, f"{took * 1000:.1f} ms"
    assert took < 20 * linear + 0.02, f"{took * 1000:.2f} ms against {linear * 1000:.2f} ms"


@pytest.mark.parametrize("shape", list(ADVERSARIAL))
def test_every_pattern_is_linear_on_digit_runs(shape: str) -> None:
    # each pattern alone, on more than the examined part of a message: 20,000 characters
    # cost the quadratic token count about 4 s
    message = ADVERSARIAL[shape][:20_000]
    plain = "The prompt exceeds " + "x" * (len(message) - 19)
    patterns = [p for p in vars(context_overflow).values() if isinstance(p, re.Pattern)]
    patterns += CONTEXT_OVERFLOW_PATTERNS
    for pattern in patterns:
        took = _best_of(3, lambda: pattern.search(message))  # noqa: B023 - called at once
        linear = _best_of(3, lambda: pattern.search(plain))  # noqa: B023
        # the slack is far above a busy machine's noise and far below a quadratic search
        # (seconds): a bound of 2 ms failed one run under load at 2.5 ms
        assert took < 20 * linear + 0.02, f"{pattern.pattern}: {took * 1000:.1f} ms"


def test_a_wording_after_a_long_prefix_is_found_in_the_tail() -> None:
    # a proxy's long prefix (a traceback, the request echoed) before the upstream's words
    _, wording = WORDINGS[0]
    assert is_context_overflow("x" * 50_000 + wording, None, None)
    assert is_context_overflow(wording + "y" * 50_000, None, None)
