"""One task for OpenHands' SDK, run by the agents' own Python (make agents), not the gateway's.

    .venv-agents/openhands/bin/python tests/agents/openhands_task.py \
        --base-url http://127.0.0.1:PORT/v1 --workspace DIR [--stream] PROMPT

The agent is the SDK's default one (`get_default_agent`, CLI mode: terminal, file editor,
task tracker), its LLM LiteLLM's `openai/local` at the gateway, as README.md sets it up.
Exit status: 0 when the conversation finished, 1 when it ended in any other state or an
error, which is printed. Prints each event's kind and the agent's words, so a failed test
shows what the agent saw.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from openhands.sdk import LLM, Conversation
from openhands.sdk.conversation.state import ConversationExecutionStatus
from openhands.tools.preset.default import get_default_agent
from pydantic import SecretStr


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--model", default="openai/local")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "none"))
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("prompt")
    args = parser.parse_args(argv)

    llm = LLM(
        model=args.model,
        base_url=args.base_url,
        api_key=SecretStr(args.api_key),
        usage_id="agent",
        stream=args.stream,
    )
    agent = get_default_agent(llm=llm, cli_mode=True)
    tokens: list[str] = []

    def on_token(chunk: Any) -> None:  # streaming needs a consumer of the deltas
        for choice in getattr(chunk, "choices", None) or []:
            text = getattr(getattr(choice, "delta", None), "content", None)
            if text:
                tokens.append(text)

    def on_event(event: Any) -> None:
        said = ""
        if getattr(event, "source", None) == "agent" and getattr(event, "llm_message", None):
            said = " ".join(getattr(c, "text", "") for c in event.llm_message.content)
        print(f"event: {type(event).__name__} {said}".rstrip(), flush=True)

    conversation = Conversation(
        agent=agent,
        workspace=args.workspace,
        callbacks=[on_event],
        token_callbacks=[on_token] if args.stream else None,
        visualizer=None,
        max_iteration_per_run=10,  # the task takes three steps
    )
    try:
        conversation.send_message(args.prompt)
        conversation.run()
    except Exception as exc:  # the agent's failure is the result, shown to the test
        print(f"error: {type(exc).__name__}: {exc}", flush=True)
        return 1
    status = conversation.state.execution_status
    print(f"status: {status.value}", flush=True)
    print(f"streamed: {''.join(tokens)!r}", flush=True)
    return 0 if status is ConversationExecutionStatus.FINISHED else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
