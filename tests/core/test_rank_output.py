"""The launcher's relay of its ranks' output and the last line it quotes (no torchrun)."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from hyper_core.parallel.rank_output import (
    LINE_CHARS,
    TAIL_LINES,
    OutputRelay,
    OutputTail,
    meaningful_line,
)
from hyper_core.parallel.rank_status import STATUS_DIR_ENV

GLOO_DUMP = [
    "[W1205 18:02:11.123456 ProcessGroupGloo.cpp:91] Warning: Unable to resolve hostname",
    "[rank0]:[E1205 18:02:11.5 ProcessGroupGloo.cpp:143] Rank 0 lost its peer",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:22430",
]
TRACEBACK = [
    "Traceback (most recent call last):",
    '  File "/x/trainer.py", line 12, in step',
    "    loss.backward()",
    "    ^^^^^^^^^^^^^^^",
]


def test_the_meaningful_line_skips_library_logs_tracebacks_and_bars() -> None:
    said = "hyper-train: loading shard 3 of 8 from /nfs/data"
    noise = [*GLOO_DUMP, *TRACEBACK, " 40%|████      | 4/10 [00:01<00:02]", "", "   "]
    assert meaningful_line([said, *noise]) == said
    # A traceback's own last line (the exception) is what it says.
    assert meaningful_line([*TRACEBACK, "[rank1]: OSError: disk full"]) == "OSError: disk full"
    assert meaningful_line(noise) is None


def test_the_tail_shows_what_a_terminal_shows_and_stays_bounded() -> None:
    tail = OutputTail()
    tail.feed("stderr", b"step 1/8 loss 4.2\nfetch")
    tail.feed("stdout", b"from stdout\n")
    tail.feed("stderr", b"ing 10%\rfetching 90%\rfetched\n")  # an animation: its last frame
    assert list(tail.lines) == ["step 1/8 loss 4.2", "from stdout", "fetched"]
    tail.feed("stderr", b"\x1b[32msaving step-4\x1b[0m\n\r 50%|\xe2\x96\x88\xe2\x96\x88   |")
    assert tail.last_line() == "saving step-4"  # the unended bar fragment is not it
    tail.feed("stderr", b"\nreading shard 7")  # a rank that hung in the middle of a line
    assert tail.last_line() == "reading shard 7"

    tail.feed(
        "stderr", b"x" * (20 * LINE_CHARS) + b"\n" + b"line\n" * (3 * TAIL_LINES) + b"y" * 10**6
    )
    assert len(tail.lines) == TAIL_LINES
    assert all(len(line) <= LINE_CHARS for line in tail.lines)
    assert sum(len(p) for p in tail._partial.values()) <= 8 * LINE_CHARS


def test_the_relay_copies_each_rank_and_keeps_a_killed_ranks_last_line(tmp_path: Path) -> None:
    """A rank process that sends its streams to the relay, writes, and is SIGKILLed: its
    output reaches the launcher's streams and its last meaningful line is kept."""
    out, err = io.BytesIO(), io.BytesIO()
    relay = OutputRelay.open(tmp_path, 2, out, err)
    assert relay is not None
    rank = textwrap.dedent(
        """
        import os, signal, sys
        from hyper_core.parallel.rank_output import connect_output
        assert connect_output()
        print("to stdout", flush=True)
        print("chaos: rank 1 dies now", file=sys.stderr, flush=True)
        os.write(2, b"[E1205 18:02:11.5 ProcessGroupGloo.cpp:143] lost peer\\n\\r 50%|##   |")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {
        STATUS_DIR_ENV: str(tmp_path),
        "RANK": "1",
        "LOCAL_RANK": "1",
        "PYTHONPATH": ":".join(sys.path),
    }
    proc = subprocess.run([sys.executable, "-c", rank], env=env, timeout=60, check=False)
    relay.close()
    assert proc.returncode == -signal.SIGKILL
    assert out.getvalue() == b"to stdout\n"
    assert err.getvalue().startswith(b"chaos: rank 1 dies now\n[E1205")
    assert relay.last_line(1) == "chaos: rank 1 dies now"
    assert relay.last_line(0) is None  # rank 0 wrote nothing


def test_a_process_not_started_by_the_launcher_keeps_its_streams(tmp_path: Path) -> None:
    script = "from hyper_core.parallel.rank_output import connect_output; print(connect_output())"
    env = {STATUS_DIR_ENV: str(tmp_path), "LOCAL_RANK": "0", "PYTHONPATH": ":".join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout == "False\n"  # no pipes in the folder: nothing is redirected
