"""A viewer that reads the page's event stream as fast as it comes, in a process of its
own so that its reading does not take the load generator's time.

Run: ``python -m bench.ui_fanout.viewer --port N``; prints ``reading`` once connected.
"""

from __future__ import annotations

import argparse
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ui_fanout.viewer")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    with socket.create_connection(("127.0.0.1", args.port)) as sock:
        sock.sendall(b"GET /ui/api/events HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        print("reading", flush=True)
        while sock.recv(1 << 16):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
