"""``python -m bench.overhead``: run the overhead benchmark and print its table."""

import sys

from bench.overhead.run import run

sys.exit(run())
