"""What a llama.cpp chat template does with reasoning, checked once when the server is found.

Pure: reads ``/props`` and one probe rendering (``POST /apply-template`` of
``PROBE_MESSAGES``); the local fleet does the I/O.
"""

from __future__ import annotations

from typing import Any

PROBE_REASONING = "probe-reasoning"
PROBE_MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "probe-question"},
    {"role": "assistant", "content": "probe-answer", "reasoning_content": PROBE_REASONING},
    {"role": "user", "content": "probe-next"},
]
# a system message after the conversation began: a template that takes it renders its text
PROBE_MID_SYSTEM = "probe-mid-system"
PROBE_MID_SYSTEM_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "probe-system"},
    {"role": "user", "content": "probe-question"},
    {"role": "assistant", "content": "probe-answer"},
    {"role": "system", "content": PROBE_MID_SYSTEM},
    {"role": "user", "content": "probe-next"},
]
# what the reasoning budget writes before the end tag it forces, to match such a template
NEWLINE_BUDGET_MESSAGE = "\n"


def template_reasons(props: dict[str, Any]) -> bool:
    """Whether the model's chat template speaks of reasoning at all."""
    template = props.get("chat_template")
    if not isinstance(template, str):
        return False
    return "<think>" in template or "reasoning_content" in template


def reasoning_back_refusal(props: dict[str, Any], template_preserves: bool) -> str | None:
    """Why a reasoning model's earlier reasoning cannot go back to it, if it cannot."""
    if template_preserves or not template_reasons(props):
        return None
    return (
        "the chat template does not render earlier turns' reasoning "
        "(supports_preserve_reasoning: false), so each turn reads the previous answer "
        "again; use a template that renders reasoning_content (docs/reasoning.md)"
    )


def renders_newline_before_end(rendered: str) -> bool:
    """Whether the template writes a newline between an earlier turn's reasoning and
    ``</think>``: a budget that forces ``</think>`` right after a word then generates what
    the template will not render, and the cache stops matching there."""
    return PROBE_REASONING + "\n</think>" in rendered


def renders_mid_system(rendered: str | None) -> bool:
    """Whether the template rendered the probe's system message after the start (None:
    it refused to render it, as most llama.cpp templates do), after the earlier turns."""
    if rendered is None or PROBE_MID_SYSTEM not in rendered:
        return False
    return rendered.index(PROBE_MID_SYSTEM) > rendered.find("probe-answer")
