"""Recognising "the prompt is longer than the context" in every provider's words.

Three tests, in order: the error's code or type, then a table of known
wordings (one entry per wording, each with where it comes from and a test),
then, for a 400 only, a conservative fallback for wordings nobody listed yet:
the message must speak of the prompt/input being over a limit and state a
number of tokens, and must not speak of rates, quotas, the answer's length or
sizes in bytes or characters.
"""

from __future__ import annotations

import re

_I = re.IGNORECASE

# (source, wording); the table is searched, so a proxy's prefix ("openai error: ",
# "litellm.BadRequestError: ...") around a wording does not hide it.
KNOWN_WORDINGS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # llama.cpp tools/server/server-context.cpp: "request (N tokens) exceeds the available
    # context size (M tokens), try increasing it"; older builds: "the request exceeds the
    # available context size. try increasing the context size or enable context shift"
    ("llama.cpp", re.compile(r"exceeds the available context size", _I)),
    # llama.cpp, same file, for a task that cannot be split: "input (N tokens) is larger than
    # the max context size (M tokens). skipping"
    ("llama.cpp", re.compile(r"is larger than the max context size", _I)),
    # OpenAI, Azure OpenAI, DeepSeek, vLLM before its renderer, Aphrodite
    # (aphrodite/endpoints/openai/serving_engine.py), OpenRouter ("This endpoint's maximum
    # context length is N tokens. However, ..."): "This model's maximum context length is
    # N tokens. However, ..."
    ("OpenAI and compatibles", re.compile(r"maximum context length is \d+ tokens", _I)),
    # OpenAI (GPT-5 family): "Input tokens exceed the configured limit of 272000 tokens.
    # Your messages resulted in N tokens."
    ("OpenAI", re.compile(r"input tokens exceed the configured limit", _I)),
    # OpenAI Responses API (and Codex): "Your input exceeds the context window of this model."
    ("OpenAI", re.compile(r"input exceeds the context window", _I)),
    # Groq and Cerebras (and OpenAI's older wording): "Please reduce the length of the messages
    # or completion." Cerebras adds "Current length is N while limit is M".
    ("Groq, Cerebras", re.compile(r"reduce the length of the messages or completion", _I)),
    # vLLM vllm/renderers/params.py: "You passed N input tokens and requested M output
    # tokens. However, the model's context length is only C tokens, resulting in a maximum
    # input length of I tokens." (and the same with "input characters")
    ("vLLM", re.compile(r"context length is only \d+ tokens", _I)),
    # vLLM V1 engine input checks: "The decoder prompt (length N) is longer than the maximum
    # model length of M."
    ("vLLM", re.compile(r"is longer than the maximum model length", _I)),
    # Anthropic (and Fireworks, ollama.com: "The prompt is too long: N, model maximum context
    # length: M"): "prompt is too long: 208656 tokens > 200000 maximum"
    ("Anthropic, Fireworks", re.compile(r"prompt is too long", _I)),
    # Anthropic: "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000"
    ("Anthropic", re.compile(r"exceed context limit", _I)),
    # Amazon Bedrock (ValidationException): "Input is too long for requested model."
    ("Amazon Bedrock", re.compile(r"input is too long for (the )?requested model", _I)),
    # Gemini and Vertex AI (also its OpenAI-compatible endpoint): "The input token count (N)
    # exceeds the maximum number of tokens allowed (M)."
    # (the gap is bounded: an unbounded one rescans the rest of the message from each
    # "input token count" in it)
    ("Gemini, Vertex AI", re.compile(r"input token count.{0,200}?exceeds the maximum", _I)),
    # SGLang, Together: "The input (61709 tokens) is longer than the model's context length
    # (40960 tokens)."
    ("SGLang, Together", re.compile(r"is longer than the model's context length", _I)),
    # SGLang: "Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens)."
    # Baseten (Poolside models on OpenRouter): "Input length N exceeds the maximum allowed
    # input length of M tokens."
    ("SGLang, Baseten", re.compile(r"exceeds the maximum allowed (input )?length", _I)),
    # SGLang python/sglang/srt/managers/tokenizer_manager.py: "Requested token count exceeds
    # the model's maximum context length of N tokens. You requested a total of ..."; Ollama
    # x/mlxrunner/pipeline.go: "input length (N tokens) exceeds the model's maximum context
    # length (M tokens)"
    ("SGLang, Ollama", re.compile(r"exceeds the model's maximum context length", _I)),
    # TensorRT-LLM tensorrt_llm/llmapi/llm.py: "The sum of prompt length (N), query length (0)
    # should not exceed max_num_tokens (M)" (PyTorch backend) and "... should not exceed
    # max_seq_len (M)" (TensorRT backend)
    (
        "TensorRT-LLM",
        re.compile(r"sum of prompt length .{0,80}should not exceed max_(num_tokens|seq_len)", _I),
    ),
    # LMDeploy lmdeploy/serve/core/async_engine.py and exceptions.py: "Input length (N) must
    # be smaller than the model context length (M)." / "The request exceeds the model context
    # length."
    ("LMDeploy", re.compile(r"(must be smaller than|exceeds) the model context length", _I)),
    # MLC LLM python/mlc_llm/serve/engine_utils.py: "Request prompt has N tokens in total,
    # larger than the model input length limit M."
    ("MLC LLM", re.compile(r"larger than the model input length limit", _I)),
    # Mistral: "Prompt contains 40000 tokens and 0 draft tokens, too large for model with
    # 32768 maximum context length"
    ("Mistral", re.compile(r"too large for model with \d+ maximum context length", _I)),
    # text-generation-inference router/src/validation.rs (Hugging Face, Together): "Input
    # validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: ..." /
    # "`inputs` must have less than 4096 tokens. Given: 5000"
    (
        "text-generation-inference",
        re.compile(r"`inputs` (tokens \+ `max_new_tokens` must be <=|must have less than)"),
    ),
    # xAI: "This model's maximum prompt length is 131072 but the request contains N tokens."
    ("xAI", re.compile(r"maximum prompt length is \d+", _I)),
    # Ollama llm/llama_server.go: "the prompt is longer than the context length currently
    # available to the model; ..." and (embeddings) "the input length exceeds the context
    # length"; ollama.com: "prompt too long; exceeded max context length by N tokens"
    (
        "Ollama",
        re.compile(
            r"prompt is longer than the context length|input length exceeds the context length"
            r"|exceeded max context length",
            _I,
        ),
    ),
    # LM Studio: "The number of tokens to keep from the initial prompt is greater than the
    # context length (n_keep: N >= n_ctx: M). Try to load the model with a larger context
    # length, or provide a shorter input."
    ("LM Studio", re.compile(r"initial prompt is greater than the context length", _I)),
    # Moonshot / Kimi (platform.kimi.ai/docs/api/errors): "Input token length too long" and
    # "Your request exceeded model token limit : {max_model_length}"
    ("Moonshot Kimi", re.compile(r"input token length too long|exceeded model token limit", _I)),
    # MiniMax (error 2013): "invalid params, context window exceeds limit (2013)"
    ("MiniMax", re.compile(r"context window exceeds limit", _I)),
    # Alibaba Qwen / DashScope (Model Studio error codes, 400 InvalidParameter): "Range of
    # input length should be [1, N]"
    ("Qwen DashScope", re.compile(r"range of input length should be", _I)),
    # Baidu Qianfan (qianfan-api error codes, code tokens_too_long): "Prompt tokens too long"
    ("Baidu Qianfan", re.compile(r"prompt tokens too long", _I)),
    # SiliconFlow: "number of input tokens (N) have exceeded max_prompt_tokens (M) limit."
    ("SiliconFlow", re.compile(r"exceeded max_prompt_tokens", _I)),
    # LiteLLM litellm/exceptions.py (its proxy's 400s): "litellm.ContextWindowExceededError: ..."
    ("LiteLLM", re.compile(r"ContextWindowExceededError")),
)

CONTEXT_OVERFLOW_PATTERNS: tuple[re.Pattern[str], ...] = tuple(p for _, p in KNOWN_WORDINGS)

# llama.cpp's error type; ds4's (antirez/ds4: "Prompt tokens (N) exceeds context size (M)")
CONTEXT_OVERFLOW_TYPES = frozenset({"exceed_context_size_error", "context_exceeded"})
# OpenAI's code (also Groq's, Azure's); Baidu Qianfan's
CONTEXT_OVERFLOW_CODES = frozenset({"context_length_exceeded", "tokens_too_long"})

# The fallback, for a 400 in words not in the table. All four must hold.
_FALLBACK_SUBJECT = re.compile(r"\b(prompt|input|messages?|conversation|context)\b", _I)
_FALLBACK_OVER = re.compile(
    r"exceed|too (long|large|many)|longer than|greater than|more than|over the limit", _I
)
# A count is matched from the start of its run of digits and commas only, and never gives
# back what it took: tried at every digit of a long run, each try rescanning the rest
# of it, the match was quadratic in the run's length (4,000 digits held the event loop
# for 0.2 s, 100,000 for minutes).
_FALLBACK_TOKEN_COUNT = re.compile(r"(?<![\d,]),*+\d[\d,]*+\s*+tokens?\b|\btokens?\b\D{0,30}\d", _I)
# ...and none of these: a rate or quota, the answer's own limit, a size that is not tokens
_FALLBACK_VETO = re.compile(
    r"rate.?limit|per (second|minute|hour|day)|\b[RT]P[MD]\b|quota|throttl"
    r"|max_(new_|completion_|output_)?tokens|maximum tokens|output tokens|completion tokens"
    r"|characters|\bchars?\b|bytes|\b[KM]i?B\b",
    _I,
)


# An overflow is said in a sentence, which a proxy may wrap in a prefix or a suffix of its
# own: the message's first and last characters are read, not a whole body of 64 MiB (the
# table's patterns are linear, but 35 scans of 100 KB still held the loop for 0.1 s).
EXAMINED_HEAD = 2048
EXAMINED_TAIL = 2048


def examined(message: str) -> str:
    """What of ``message`` the patterns read: all of it when short, else its head and tail."""
    if len(message) <= EXAMINED_HEAD + EXAMINED_TAIL:
        return message
    return f"{message[:EXAMINED_HEAD]}\n...\n{message[-EXAMINED_TAIL:]}"


def is_context_overflow(
    message: str, error_type: str | None, code: object, status: int | None = None
) -> bool:
    """True when an upstream error says the prompt does not fit the model's context."""
    if code in CONTEXT_OVERFLOW_CODES or error_type in CONTEXT_OVERFLOW_TYPES:
        return True
    message = examined(message)
    if any(p.search(message) for p in CONTEXT_OVERFLOW_PATTERNS):
        return True
    return status == 400 and _looks_like_overflow(message)


def _looks_like_overflow(message: str) -> bool:
    return bool(
        _FALLBACK_SUBJECT.search(message)
        and _FALLBACK_OVER.search(message)
        and _FALLBACK_TOKEN_COUNT.search(message)
        and not _FALLBACK_VETO.search(message)
    )
