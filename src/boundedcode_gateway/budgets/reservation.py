"""What a call may spend at most, worked out before it is sent: its reservation against
the budgets of its caller and its task. Pure functions.

No tokenizer is at hand before a call, so the prompt is bounded from its bytes: every
token of text is at least one byte of its UTF-8 (the byte-level tokenizers of the
models served here never make a token of less), the JSON around each message (its
keys and quotes, some 30 bytes) is more than the few tokens a chat template puts
around it, and ``TEMPLATE_TOKENS`` covers what a template adds once (its default
system prompt, its instructions for tools). A media part is counted as
``MEDIA_PART_TOKENS`` whatever its size: its base64 is far larger than the tokens it
becomes. The answer is bounded by the caller's ``max_completion_tokens`` or
``max_tokens`` (times ``n``), else the profile's own cap, else an estimate; only the
first two make the reservation a hard bound (``Reservation.hard``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from boundedcode_gateway.budgets.spent import Spent
from boundedcode_gateway.config import PriceSettings
from boundedcode_gateway.json_values import is_int
from boundedcode_gateway.policy.media import media_parts
from boundedcode_gateway.wire.chat import max_output_tokens

# what a chat template adds to a prompt once, at most (a default system prompt, the
# instructions around tool definitions)
TEMPLATE_TOKENS = 1024
# one image, audio or video part: more than any of the providers' tilings of an image
# of the largest size they take, or a llama.cpp vision model's patches
MEDIA_PART_TOKENS = 16_384


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a call may spend at most (``amount``), and whether that is a hard bound: the
    answer's length capped and no price per second of a server's work."""

    amount: Spent
    hard: bool


def prompt_token_bound(body: dict[str, Any]) -> int:
    """The most tokens the prompt of chat ``body`` can be (see the module's docstring)."""
    messages = body.get("messages")
    tools = body.get("tools")
    total = TEMPLATE_TOKENS + len(orjson.dumps(messages if isinstance(messages, list) else []))
    if isinstance(tools, list):
        total += len(orjson.dumps(tools))
    if isinstance(messages, list):
        for part in media_parts(messages):
            total += MEDIA_PART_TOKENS - sum(len(value) for _, value in part.sources)
    return max(total, TEMPLATE_TOKENS)


def output_token_bound(
    body: dict[str, Any], profile_cap: int | None, estimate: int
) -> tuple[int, bool]:
    """The most tokens the answers can be, and whether that is a cap the upstream keeps
    (the caller's, or the profile's own) rather than ``estimate``."""
    choices = body.get("n")
    n = choices if is_int(choices) and choices > 1 else 1
    asked = max_output_tokens(body)
    if asked is not None and asked > 0:
        return asked * n, True
    if profile_cap is not None:
        return profile_cap * n, True
    return estimate * n, False


def reservation_for(
    body: dict[str, Any],
    price: PriceSettings | None,
    *,
    profile_cap: int | None,
    output_estimate: int,
    call_s_estimate: float,
) -> Reservation:
    """What a call of chat ``body`` on a profile priced at ``price`` may spend at most."""
    prompt = prompt_token_bound(body)
    output, capped = output_token_bound(body, profile_cap, output_estimate)
    cost = 0.0
    timed = False
    if price is not None:
        cost = (prompt * price.input_per_mtok + output * price.output_per_mtok) / 1_000_000
        if price.gpu_second is not None:
            # a server's time is not bounded by the tokens: an estimate, never hard
            cost += price.gpu_second * call_s_estimate
            timed = price.gpu_second > 0
    return Reservation(Spent(cost, prompt + output, prompt), capped and not timed)
