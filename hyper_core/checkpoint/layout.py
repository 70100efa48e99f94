"""The layout of a run's checkpoints on disk, and finding one in it.

Under ``output_dir/checkpoints``::

    step-N/            one checkpoint (its ``COMPLETE`` marker holds N once it is whole)
    .tmp-step-N/       a checkpoint being written (never loaded)
    latest             the name of the newest complete checkpoint

A run resumed at step M writes its config as ``output_dir/config.step-M.toml`` (its first run:
``config.toml``), so every checkpoint's config can be found (:func:`run_config_for`).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from ..errors import UserError

#: The marker file of a whole checkpoint (it holds the step).
COMPLETE = "COMPLETE"
#: The file of a checkpoint's :class:`~hyper_core.checkpoint.identity.ModelIdentity`.
MODEL_FILE = "model.json"
#: The name of a checkpoint folder, ``step-N``.
STEP_RE = re.compile(r"^step-(\d+)$")
#: The prefix of a checkpoint folder being written.
TMP_PREFIX = ".tmp-step-"
_CONFIG_STEP_RE = re.compile(r"^config\.step-(\d+)\.toml$")


def complete_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoint folders under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = STEP_RE.match(child.name)
        if m and (child / COMPLETE).is_file():
            found.append((int(m.group(1)), child))
    return [p for _, p in sorted(found)]


def find_resume_checkpoint(root: Path) -> Path | None:
    """The checkpoint ``resume = "auto"`` loads: ``latest`` if complete, else the newest."""
    latest = root / "latest"
    if latest.is_file():
        candidate = root / latest.read_text().strip()
        if STEP_RE.match(candidate.name) and (candidate / COMPLETE).is_file():
            return candidate
    complete = complete_checkpoints(root)
    return complete[-1] if complete else None


def step_of_name(path: Path) -> int:
    """N of a ``step-N`` folder, -1 for another name."""
    m = STEP_RE.match(path.name)
    return int(m.group(1)) if m else -1


def checkpoint_step(path: Path) -> int | None:
    """The step a complete checkpoint was saved at (its ``COMPLETE`` marker, else its name)."""
    with contextlib.suppress(OSError, ValueError):
        return int((path / COMPLETE).read_text().strip())
    m = STEP_RE.match(path.name)
    return int(m.group(1)) if m else None


def run_config_for(checkpoint: Path) -> Path | None:
    """The config of the run that saved ``checkpoint`` (``output_dir/checkpoints/step-N``).

    A run resumed at step M writes ``config.step-M.toml`` (its first run: ``config.toml``), so
    a checkpoint of step N was saved under the newest ``config.step-M.toml`` with M < N, else
    under ``config.toml``. None if there is neither.
    """
    out = checkpoint.parent.parent
    step = checkpoint_step(checkpoint)
    resumed = []
    if step is not None and out.is_dir():
        for f in out.iterdir():
            m = _CONFIG_STEP_RE.match(f.name)
            if m and int(m.group(1)) < step:
                resumed.append((int(m.group(1)), f))
    if resumed:
        return max(resumed)[1]
    first = out / "config.toml"
    return first if first.is_file() else None


def resolve_checkpoint(path: str | Path) -> Path:
    """A complete checkpoint folder from a ``step-N`` folder, a ``checkpoints`` folder or a
    run's ``output_dir`` (the latest complete one), or the ``latest`` pointer file (the
    checkpoint it names); :class:`UserError` if there is none."""
    path = Path(path)
    if path.is_file() and path.name == "latest":
        name = path.read_text().strip()
        target = path.parent / name
        if STEP_RE.match(name) and (target / COMPLETE).is_file():
            return target
        raise UserError(
            f"{path}: points to {name!r} ({target}), which is not a complete checkpoint "
            f"(no {COMPLETE} marker); pass a checkpoints/step-N folder or the run's output_dir"
        )
    if (path / COMPLETE).is_file():
        return path
    for root in (path, path / "checkpoints"):
        found = find_resume_checkpoint(root)
        if found is not None:
            return found
    raise UserError(f"{path}: not a complete checkpoint (no {COMPLETE} marker), nor a run with one")
