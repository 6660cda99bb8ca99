"""aider's own coders, run by aider's Python (make agents), not the gateway's: what each edit
format's request says, and what each coder does with an answer.

    .venv-agents/aider/bin/python tests/agents/aider_coders.py prompts FORMAT...
        → {format: the messages aider sends for the user's request, in the OpenAI shape}
    .venv-agents/aider/bin/python tests/agents/aider_coders.py apply < {format: answer}
        → {format: {"files": {name: text}, "error": the coder's complaint or null}}

`apply` hands each answer to a coder of its format in an empty folder of its own, as aider
does with a streamed answer (`partial_response_content`, then `apply_updates`), and reads
back what it wrote. The request is TASK below; tests/agents/test_aider.py sends the same.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from aider.coders import Coder
from aider.io import InputOutput
from aider.models import Model, model_info_manager

MODEL = "openai/local"
# what tests/agents/chat_agents.py gives aider in --model-metadata-file: no model list fetched
model_info_manager.local_model_metadata[MODEL] = {
    "max_input_tokens": 32768,
    "max_output_tokens": 4096,
    "litellm_provider": "openai",
    "mode": "chat",
}
TASK = 'Create the file hello.txt containing exactly the text "hello from aider", then say done.'


def _coder(edit_format: str, root: Path) -> Any:
    quiet = InputOutput(yes=True, pretty=False, fancy_input=False)
    os.chdir(root)
    return Coder.create(
        main_model=Model(MODEL),
        edit_format=edit_format,
        io=quiet,
        fnames=[],
        use_git=False,
        map_tokens=0,
        stream=False,
        auto_lint=False,
        suggest_shell_commands=False,
        detect_urls=False,
    )


def prompts(formats: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fmt in formats:
        with tempfile.TemporaryDirectory() as root:
            coder = _coder(fmt, Path(root))
            coder.cur_messages = [{"role": "user", "content": TASK}]
            out[fmt] = [dict(m) for m in coder.format_messages().all_messages()]
    return out


def apply(answers: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for fmt, answer in answers.items():
        with tempfile.TemporaryDirectory() as folder:
            root = Path(folder).resolve()
            coder = _coder(fmt, root)
            coder.partial_response_content = answer
            said = io.StringIO()
            with contextlib.redirect_stdout(said):
                coder.apply_updates()
            files = {
                str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()
            }
            complaint = getattr(coder, "reflected_message", None) or None
            out[fmt] = {"files": files, "error": complaint, "said": said.getvalue()[-500:]}
    return out


def main(argv: list[str]) -> int:
    # what aider prints goes to stderr; stdout is the answer alone
    with contextlib.redirect_stdout(sys.stderr):
        if argv[:1] == ["prompts"]:
            result = prompts(argv[1:])
        elif argv == ["apply"]:
            result = apply(json.load(sys.stdin))
        else:
            print(__doc__)
            return 2
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
