"""Checkpoints: their layout on disk (:mod:`.layout`), the identity of the model one holds
(:mod:`.identity`) and the DCP checkpointer that saves and resumes runs (:mod:`.checkpointer`).

The public names of the three are importable from here (``from hyper_core.checkpoint import
Checkpointer``).
"""

from __future__ import annotations

from .checkpointer import (
    CheckpointedRun,
    Checkpointer,
    CheckpointUnreadable,
    check_shards,
    non_finite_parameter,
    read_extra_state,
    read_identity,
)
from .identity import ModelIdentity
from .layout import (
    COMPLETE,
    MODEL_FILE,
    checkpoint_step,
    complete_checkpoints,
    find_resume_checkpoint,
    resolve_checkpoint,
    run_config_for,
)

__all__ = [
    "COMPLETE",
    "MODEL_FILE",
    "CheckpointUnreadable",
    "CheckpointedRun",
    "Checkpointer",
    "ModelIdentity",
    "check_shards",
    "checkpoint_step",
    "complete_checkpoints",
    "find_resume_checkpoint",
    "non_finite_parameter",
    "read_extra_state",
    "read_identity",
    "resolve_checkpoint",
    "run_config_for",
]
