"""Progress display: a bar on a terminal, quiet log lines elsewhere (CI, pipes)."""

from __future__ import annotations

import sys
from typing import Any

from ..hookspecs import hookimpl
from .metrics import is_interactive


class Progress:
    """Rank 0's progress bar (tqdm) or one line per logged step."""

    def __init__(self, config: Any, dist: Any) -> None:
        mode = config.logging.progress
        if mode == "auto":
            mode = "bar" if is_interactive() else "lines"
        self.mode = mode
        self._bar: Any = None

    @hookimpl
    def on_train_begin(self, trainer: Any, state: Any) -> None:
        if self.mode == "bar":
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=trainer.train_iters,
                initial=state.global_step,
                desc="train",
                dynamic_ncols=True,
                file=sys.stderr,
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
        accs = "  ".join(
            f"{k.removeprefix('accuracy_')} {v:.3f}"
            for k, v in metrics.items()
            if k.startswith("accuracy_")
        )
        msg = f"eval step {metrics.get('step')}: loss {metrics['eval_loss']:.4f}"
        if accs:
            msg += f"  accuracy: {accs}"
        if self._bar is not None:
            self._bar.write(msg, file=sys.stderr)
        else:
            print(msg, file=sys.stderr, flush=True)

    @hookimpl
    def on_train_end(self) -> None:
        if self._bar is not None:
            self._bar.close()

    @hookimpl
    def on_train_error(self) -> None:
        if self._bar is not None:
            self._bar.close()
