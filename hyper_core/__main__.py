"""``python -m hyper_core`` is ``hyper-train`` (used under torchrun, where a rank ends through
:func:`~hyper_core.parallel.exit.exit_rank`)."""

import sys

from .cli import main
from .parallel.exit import exit_rank, is_torchrun_rank

code = main()
if is_torchrun_rank():
    exit_rank(code)
sys.exit(code)
