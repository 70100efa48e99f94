"""``python -m hyper_core`` is ``hyper-train`` (used under torchrun)."""

import sys

from .cli import main

sys.exit(main())
