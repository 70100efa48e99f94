"""Progress display: a bar on a terminal, quiet log lines elsewhere (CI, pipes).

Only our bar: libraries' own bars (transformers' "Loading weights") are off unless it shows,
and log lines go above the bar, not onto its line.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import Any

from ..hookspecs import hookimpl
from .metrics import is_interactive


def progress_mode(config: Any) -> str:
    """``[logging] progress`` with ``auto`` resolved: ``bar`` on a terminal, else ``lines``."""
    mode = str(config.logging.progress)
    if mode == "auto":
        return "bar" if is_interactive() else "lines"
    return mode


@contextlib.contextmanager
def library_bars(config: Any) -> Iterator[None]:
    """transformers' progress bars (loading, saving weights) only when our bar shows: not in
    piped logs, nor with ``progress = "none"``/``"lines"``; restored afterwards."""
    from transformers.utils import logging as hf_logging

    if progress_mode(config) == "bar" or hf_logging.is_progress_bar_enabled() is False:
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


class Progress:
    """Rank 0's progress bar (tqdm) or one line per logged step."""

    def __init__(self, config: Any, dist: Any) -> None:
        self.mode = progress_mode(config)
        self._bar: Any = None
        self._logs_above_bar: contextlib.ExitStack | None = None

    @hookimpl
    def on_train_begin(self, trainer: Any, state: Any) -> None:
        if self.mode == "bar":
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._bar = tqdm(
                total=trainer.train_iters,
                initial=state.global_step,
                desc="train",
                dynamic_ncols=True,
                file=sys.stderr,
            )
            # Log lines (e.g. "saved checkpoint") through tqdm.write: above the bar.
            self._logs_above_bar = contextlib.ExitStack()
            self._logs_above_bar.enter_context(
                logging_redirect_tqdm([logging.getLogger()], tqdm_class=tqdm)
            )

    @hookimpl
    def on_step_end(self, state: Any, loss: float) -> None:
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    @hookimpl
    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        if self.mode != "lines":
            return
        parts = [f"step {metrics['step']}/{trainer.train_iters}", f"loss {metrics['loss']:.4f}"]
        if metrics.get("grad_norm") is not None:
            parts.append(f"grad_norm {metrics['grad_norm']:.3f}")
        parts.append(f"lr {metrics['lr']:.2e}")
        parts.append(f"{metrics.get('tokens_per_s', 0):.0f} tok/s")
        print("  ".join(parts), file=sys.stderr, flush=True)

    @hookimpl
    def on_evaluate(self, metrics: dict[str, Any]) -> None:
        if self.mode == "none":
            return
        msg = eval_line(metrics)
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    @hookimpl
    def on_train_end(self) -> None:
        self._close()

    @hookimpl
    def on_train_error(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._logs_above_bar is not None:
            self._logs_above_bar.close()
            self._logs_above_bar = None
        if self._bar is not None:
            self._bar.close()


def eval_line(metrics: dict[str, Any]) -> str:
    """The console line of one evaluation: loss, perplexity, token accuracy, then the answer
    accuracy per question type when the eval generates answers."""
    msg = f"eval step {metrics.get('step')}: loss {metrics['eval_loss']:.4f}"
    if metrics.get("perplexity") is not None:
        msg += f"  ppl {metrics['perplexity']:.3g}"
    if metrics.get("token_accuracy") is not None:
        msg += f"  token_acc {metrics['token_accuracy']:.3f}"
    accs = "  ".join(
        f"{k.removeprefix('accuracy_')} {v:.3f}"
        for k, v in metrics.items()
        if k.startswith("accuracy_")
    )
    if accs:
        msg += f"  accuracy: {accs}"
    return msg
