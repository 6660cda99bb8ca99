"""The fake llama-server as a program, for a managed profile's ``llama_server_bin``.

Takes llama-server's command line (``--port``, ``--alias``, ``--parallel``,
``--model`` and ``--slot-save-path`` are used, the other flags ignored) and, as
llama-server does, the key in ``LLAMA_API_KEY`` (every request but the health check's
must carry it), and serves ``FakeLlamaServer`` on 127.0.0.1 until SIGTERM, which ends
it at once, answers in progress cut off, as it ends llama-server. A profile's
``server.extra_args`` may add ``--fake-slow-answer-ms MS``: every answer is then
``SLOW_ANSWER`` with that wait between its chunks; ``--fake-restore-ineffective``
makes it a server that restores a slot and keeps nothing of it. ``write_binary`` writes an
executable that runs it, so the gateway supervises a real process without a real
llama-server.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import uvicorn

from tests.fakes.common import Reply
from tests.fakes.llama_server import FakeLlamaServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SLOW_ANSWER = "tick " * 50
# more answers than a test asks for
SLOW_ANSWERS = 1000


def write_binary(folder: Path) -> Path:
    """An executable ``fake-llama-server`` in ``folder`` that runs this module's ``main``."""
    binary = folder / "fake-llama-server"
    binary.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from tests.fakes.llama_server_process import main\n"
        "main(sys.argv[1:])\n"
    )
    binary.chmod(0o755)
    return binary


def main(argv: list[str]) -> None:
    # as llama-server, no -h of its own (it would read -hft as -h) and no abbreviations
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--alias", default="fake-model")
    parser.add_argument("--fake-slow-answer-ms", type=int)
    parser.add_argument("-np", "--parallel", type=int, default=1)
    parser.add_argument("--slot-save-path")
    parser.add_argument("-m", "--model")
    parser.add_argument("--fake-restore-ineffective", action="store_true")
    args, _ = parser.parse_known_args(argv)
    fake = FakeLlamaServer(
        model_alias=args.alias,
        api_key=os.environ.get("LLAMA_API_KEY") or None,
        total_slots=args.parallel,
    )
    if args.slot_save_path:
        fake.slot_save_path = Path(args.slot_save_path)
    if args.model:
        fake.model_path = args.model
    fake.restore_ineffective = args.fake_restore_ineffective
    if args.fake_slow_answer_ms is not None:
        delay = args.fake_slow_answer_ms
        fake.queue(*(Reply(SLOW_ANSWER, chunk_delay_ms=delay) for _ in range(SLOW_ANSWERS)))
    # uvicorn would let answers in progress finish first
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    config = uvicorn.Config(
        fake.app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        interface="asgi3",
    )
    _NoSignals(config).run()


class _NoSignals(uvicorn.Server):
    """uvicorn without its own signal handlers (SIGTERM's is set above)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
