"""Lets the tests import ``hyper_llava`` from this folder when it is not pip-installed (the
hyper-train repository runs them in place)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
