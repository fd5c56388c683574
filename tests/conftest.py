"""Shared pytest set-up.

The tests directory goes on sys.path so test modules can `from distributed_helper import run_world`,
and so that ranks spawned by it (which inherit sys.path) can import the test module that defines
their worker function.
"""

import sys
from pathlib import Path

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
