"""The checkpointer: saves and resumes a run with torch.distributed.checkpoint (DCP).

Layout under ``output_dir/checkpoints`` (:mod:`.layout`)::

    step-N/            DCP shards of model + optimizer (.metadata, __R_0.distcp, ...),
                       extra/rank-R.pt (per rank), COMPLETE
    latest             the name of the newest complete checkpoint

What a checkpoint holds: the model and optimizer (DCP, sharded as trained: FSDP2 ranks write
their shards, and DCP reshards on load, so a checkpoint saved on N ranks loads on M), and per
rank ``extra/rank-R.pt``: train state (global step, epoch, counters), LR scheduler, data-loader
position (mid-epoch: epoch and step within it), RNG states (torch, CUDA, python, numpy) and what
plugins put in ``on_save_checkpoint``. RNG states are restored only on the same world size.

Atomicity: a checkpoint is written into ``.tmp-step-N``; once every rank has finished, rank 0
writes ``COMPLETE`` into it, renames it to ``step-N`` and then rewrites ``latest``. Folders
without ``COMPLETE`` (torn by a crash, or still in flight) are never loaded. A checkpoint is not
saved at all when the weights are not finite, and a failed write (e.g. a full disk) leaves
``latest`` where it was.

Identity (:mod:`.identity`): ``model.json`` records the model a checkpoint holds (adapter,
architecture, the HF config without runtime-only keys, and every parameter's full shape); a
resume into another model is a :class:`UserError` naming what differs, before any weight is
read.

Validation: before loading, a checkpoint's ``.metadata``, the shard files it references (their
sizes) and this rank's extra state are read. Under ``resume = "auto"`` an unreadable checkpoint
is skipped with a warning for the previous complete one; an explicit path is a
:class:`UserError` naming the file. Nothing unreadable is ever deleted automatically.

``[checkpoint] async = true`` stages the state to CPU memory (a copy, so training may go on)
and writes it from a background thread, whose collectives use a gloo group of their own; the
checkpoint is finalised at the first step after every rank's write has finished (or at the
next save / the end of training).

All ranks must see ``output_dir`` (a shared file system on several nodes).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import shutil
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ..errors import RunFailed, UserError
from .identity import ModelIdentity
from .layout import (
    COMPLETE,
    MODEL_FILE,
    TMP_PREFIX,
    complete_checkpoints,
    find_resume_checkpoint,
    resolve_checkpoint,
    step_of_name,
)

if TYPE_CHECKING:
    import torch

    from ..parallel.env import DistEnv
    from ..trainer.state import TrainState

log = logging.getLogger("hyper_train")

#: A failed write with less free space than this on the file system is a full disk.
_FULL_DISK_BYTES = 64 << 20


_NO_PG_WARNING = r"torch\.distributed is disabled, unavailable or uninitialized"


@contextlib.contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every call without a process group; one process is a supported case."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_PG_WARNING)
        yield


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    np_state = np.random.get_state()
    py_state = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": [*py_state[1], py_state[2]],
        "python_version": py_state[0],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((state["python_version"], tuple(py[:-1]), py[-1]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy(), *rest))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically and durably (fsync, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class CheckpointUnreadable(Exception):
    """A complete checkpoint whose files cannot be read (truncated, empty, missing)."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"checkpoint {path} is unreadable: {reason}")
        self.path = path
        self.reason = reason


def _one_line(exc: BaseException) -> str:
    """``Type: message`` of ``exc`` (of the first rank's failure for a DCP exception)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, Mapping) and failures:
        inner = next(iter(failures.values()))
        exc = inner[0] if isinstance(inner, tuple) else inner
    text = str(exc).strip().splitlines()
    if text:
        return f"{type(exc).__name__}: {text[0]}"
    return (
        f"{type(exc).__name__} (it ends early)" if isinstance(exc, EOFError) else type(exc).__name__
    )


def _os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` with an errno behind ``exc`` (DCP wraps each rank's failure)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, Mapping):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        todo += [e.__cause__, e.__context__]
    return None


def read_extra_state(path: Path, rank: int) -> dict[str, Any]:
    """``extra/rank-R.pt`` of ``path`` (rank 0's when saved on fewer ranks);
    :class:`CheckpointUnreadable` naming the file when it is missing or unreadable."""
    import torch

    extra_file = path / "extra" / f"rank-{rank}.pt"
    if not extra_file.is_file():
        extra_file = path / "extra" / "rank-0.pt"
    if not extra_file.is_file():
        raise CheckpointUnreadable(path, f"{extra_file} is missing")
    if not extra_file.stat().st_size:
        raise CheckpointUnreadable(path, f"{extra_file} is empty")
    try:
        extra = torch.load(extra_file, weights_only=True)
    except Exception as exc:
        raise CheckpointUnreadable(path, f"{extra_file}: {_one_line(exc)}") from exc
    if not isinstance(extra, dict) or "train_state" not in extra:
        raise CheckpointUnreadable(path, f"{extra_file} holds no train state")
    return extra


def check_shards(path: Path) -> None:
    """:class:`CheckpointUnreadable` naming the file unless ``.metadata`` reads and every shard
    file it references is there, at least as long as the data it holds there."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata_file = path / ".metadata"
    if not metadata_file.is_file():
        raise CheckpointUnreadable(path, f"{metadata_file} is missing")
    if not metadata_file.stat().st_size:
        raise CheckpointUnreadable(path, f"{metadata_file} is empty")
    try:
        metadata = FileSystemReader(str(path)).read_metadata()
    except Exception as exc:
        raise CheckpointUnreadable(path, f"{metadata_file}: {_one_line(exc)}") from exc
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, size in sorted(needed.items()):
        shard = path / name
        if not shard.is_file():
            raise CheckpointUnreadable(path, f"{shard} is missing")
        have = shard.stat().st_size
        if have < size:
            raise CheckpointUnreadable(path, f"{shard} is truncated ({have} of {size} bytes)")


def read_identity(path: Path) -> ModelIdentity | None:
    """``model.json`` of ``path``; None for a checkpoint saved before identities were kept."""
    model_file = path / MODEL_FILE
    if not model_file.is_file():
        return None
    try:
        return ModelIdentity.from_json(model_file.read_text())
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointUnreadable(path, f"{model_file}: {_one_line(exc)}") from exc


def _free_bytes(path: Path) -> int | None:
    """Bytes free to this user on the file system of ``path`` (its nearest existing parent)."""
    for p in (path, *path.parents):
        with contextlib.suppress(OSError):
            st = os.statvfs(p)
            return st.f_bavail * st.f_frsize
    return None


def non_finite_parameter(model: Any) -> str | None:
    """The name of a trained parameter (``requires_grad``) with a NaN or infinite value in
    this rank's part of ``model`` (a DTensor's local shard), or None; one device sync when all
    are finite. Frozen parameters are as loaded (and may be packed, e.g. a 4-bit base)."""
    import torch

    named = [
        (n, p.to_local() if hasattr(p, "to_local") else p)
        for n, p in model.named_parameters()
        if p.requires_grad
    ]
    named = [(n, t) for n, t in named if t.is_floating_point() and t.numel()]
    if not named:
        return None
    with torch.no_grad():
        flags = torch.stack([torch.isfinite(t).all() for _, t in named])
        if bool(flags.all()):
            return None
        return next(n for (n, _), ok in zip(named, flags.tolist(), strict=True) if not ok)


def _without_frozen_ties(model: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without the other names of tied frozen parameters: DCP's
    ``ignore_frozen_params`` goes by ``named_parameters()``, which names a tied parameter once,
    and keeps e.g. ``lm_head.weight`` tied to a frozen ``embed_tokens.weight``. Decided by
    name, so every rank drops the same keys."""
    from torch.distributed.checkpoint.state_dict import _get_fqns  # DCP's own name mapping

    frozen: set[str] = set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if not param.requires_grad:
            frozen |= _get_fqns(model, name)
    return {k: v for k, v in state.items() if k not in frozen}


@attrs.define
class _Pending:
    future: Any
    tmp_dir: Path
    final_dir: Path
    step: int
    started: float


class CheckpointedRun(Protocol):
    """What a :class:`Checkpointer` reads of the run it saves and resumes (the trainer): the
    train state, the plugin host (``on_save_checkpoint``/``on_load_checkpoint``), and the
    adapter and strategy that say which model it is (``model.json``)."""

    state: TrainState
    host: Any
    adapter: Any
    strategy: Any


class Checkpointer:
    """Saves every ``[checkpoint] every_steps`` and at the end (or on a stop); resumes per
    ``resume``. Every method that touches a checkpoint is collective: call it on all ranks.

    It saves and restores the objects it was built with (``build_checkpointer``'s ``model``,
    ``optimizer``, ``lr_scheduler`` and ``dataloaders.train``); of the run it reads only what
    :class:`CheckpointedRun` names. With ``trainable_only`` it saves and restores only the
    parameters that require grad (and their optimizer state): parameter-efficient plugins
    (``hyper-train-peft``) use it for adapter-only checkpoints.
    """

    def __init__(
        self,
        config: Any,
        dist: DistEnv,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        dataloaders: Any,
        trainable_only: bool = False,
    ) -> None:
        self.config = config
        #: Save and restore only parameters with ``requires_grad`` (e.g. LoRA adapters): the
        #: frozen ones must come back the same at every start (``[model] path`` or the seed).
        self.trainable_only = trainable_only
        self.cfg = config.checkpoint
        self.dist = dist
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.dataloaders = dataloaders
        self.root = Path(config.run.output_dir) / "checkpoints"
        self._pending: _Pending | None = None
        #: The checkpoint chosen to resume from, once chosen (a 1-tuple: None is a choice).
        self._resume: tuple[Path | None] | None = None
        self.last_saved_step: int | None = None
        #: Seconds of the last save (blocking part; async: until staged) and load.
        self.last_save_s: float | None = None
        self.last_load_s: float | None = None
        self._async_group: Any = None
        if self.cfg.async_save and dist.world_size == 1:
            # The background writer thread warns too, outside any catch_warnings().
            warnings.filterwarnings("ignore", message=_NO_PG_WARNING)
        elif self.cfg.async_save:
            import torch.distributed as tdist

            # The background save runs collectives while training runs its own: on the same
            # group their order would differ between ranks (a deadlock). A group of its own.
            self._async_group = tdist.new_group(backend="gloo")

    # -- state --------------------------------------------------------------------------------

    def _app_state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._options())
        if self.trainable_only:
            model_sd = _without_frozen_ties(self.model, model_sd)
        return {"model": model_sd, "optimizer": optim_sd}

    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        # dcp.load already fails on a key the checkpoint lacks; strict would also demand the
        # frozen parameters left out.
        return StateDictOptions(
            ignore_frozen_params=self.trainable_only, strict=not self.trainable_only
        )

    def _identity(self, run: CheckpointedRun, model_state: Mapping[str, Any]) -> ModelIdentity:
        """The identity of the model this checkpointer saves."""
        model = self.model if run.strategy is None else run.strategy.unwrap(self.model)
        return ModelIdentity.of(model, getattr(run.adapter, "name", None), model_state)

    def _extra_state(self, run: CheckpointedRun) -> dict[str, Any]:
        plugin_state: dict[str, Any] = {}
        run.host.fire("on_save_checkpoint", trainer=run, state=run.state, plugin_state=plugin_state)
        return {
            "train_state": run.state.to_dict(),
            "lr_scheduler": self.lr_scheduler.state_dict(),
            "dataloader": self.dataloaders.train.state_dict(),
            "rng": _rng_state(),
            "plugin_state": plugin_state,
            "world_size": self.dist.world_size,
            "rank": self.dist.rank,
        }

    # -- save ---------------------------------------------------------------------------------

    def maybe_save(self, trainer: CheckpointedRun, *, final: bool = False) -> None:
        """Finalise a finished async save; save when the step is a multiple of
        ``every_steps``, or when ``final`` (end of training or an agreed stop)."""
        self.poll()
        step = trainer.state.global_step
        every = self.cfg.every_steps
        due = bool(every) and step % every == 0
        if (due or final) and step != self.last_saved_step:
            self.save(trainer)

    def save(self, trainer: CheckpointedRun) -> Path:
        """Write ``step-N`` (all ranks take part). :class:`RunFailed` when the weights are not
        finite (nothing is written) or a write fails (the partial folder is removed); either
        way ``latest`` and the checkpoints are left as they were."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        self.wait()
        t0 = time.perf_counter()
        step = trainer.state.global_step
        self._refuse_non_finite(step)
        final_dir = self.root / f"step-{step}"
        tmp_dir = self.root / f"{TMP_PREFIX}{step}"
        app = self._app_state()

        def begin() -> None:
            if self.dist.is_main:
                shutil.rmtree(tmp_dir, ignore_errors=True)
                (tmp_dir / "extra").mkdir(parents=True, exist_ok=True)
                identity = self._identity(trainer, app["model"])
                (tmp_dir / MODEL_FILE).write_text(identity.to_json())

        self._agreed_write(begin, step, tmp_dir)
        extra_file = tmp_dir / "extra" / f"rank-{self.dist.rank}.pt"
        self._agreed_write(
            lambda: torch.save(self._extra_state(trainer), extra_file), step, tmp_dir
        )
        try:
            with _quiet_single_process():
                if self.cfg.async_save:
                    future = dcp.async_save(
                        app, checkpoint_id=str(tmp_dir), process_group=self._async_group
                    )
                    self._pending = _Pending(
                        future=future, tmp_dir=tmp_dir, final_dir=final_dir, step=step, started=t0
                    )
                else:
                    dcp.save(app, checkpoint_id=str(tmp_dir))
        except (Exception, CheckpointException) as exc:
            self._raise_if_disk_error(exc, step, tmp_dir)
            raise
        self.last_save_s = time.perf_counter() - t0
        self.last_saved_step = step
        if self._pending is None:
            self._finish(tmp_dir, final_dir, step, t0)
        elif self.dist.is_main:
            log.info(
                "checkpoint step-%d staged in %.2f s; writing in the background",
                step,
                self.last_save_s,
            )
        return final_dir

    def _refuse_non_finite(self, step: int) -> None:
        """:class:`RunFailed` (all ranks) when any rank's weights hold a NaN or an inf."""
        bad = non_finite_parameter(self.model)
        if not self.dist.any_true(bad is not None):
            return
        where = bad or "on another rank"
        if self.dist.is_main or bad is not None:
            log.error("step %d: parameter %s is not finite: checkpoint not saved", step, where)
        raise RunFailed(
            f"step {step}: the model's weights are not finite ({where}): checkpoint step-{step} "
            f"not saved; {self._kept()}"
        )

    def _kept(self) -> str:
        """What a failed save leaves, for its message."""
        latest = self.root / "latest"
        name = latest.read_text().strip() if latest.is_file() else None
        if name:
            return f"latest is still {name} ({self.root / name})"
        return "no checkpoint was saved before"

    def _agreed_write(self, write: Any, step: int, tmp_dir: Path) -> None:
        """Run ``write`` (this rank's files); when it fails on any rank, every rank raises (a
        collective, so no rank waits for the others): :class:`RunFailed` for an ``OSError`` or
        a full disk, else the error itself."""
        failure: Exception | None = None
        try:
            write()
        except Exception as exc:
            failure = exc
        if not self.dist.any_true(failure is not None):
            return
        if failure is None:
            self._write_failed(step, tmp_dir, None)
        else:
            self._raise_if_disk_error(failure, step, tmp_dir)
            raise failure

    def _raise_if_disk_error(self, exc: BaseException, step: int, tmp_dir: Path) -> None:
        """After a failed DCP write: :class:`RunFailed` for an ``OSError`` or a full disk (the
        zip writer of ``torch.save`` reports a short write as a ``RuntimeError``); the partial
        folder is removed either way."""
        error = _os_error(exc)
        if error is None:
            free = _free_bytes(tmp_dir)
            if free is not None and free < _FULL_DISK_BYTES:
                error = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                detail = f" ({free // 1024} KiB left; {_one_line(exc)})"
                self._write_failed(step, tmp_dir, error, detail)
        if error is not None:
            self._write_failed(step, tmp_dir, error)
        if self.dist.is_main:
            shutil.rmtree(tmp_dir, ignore_errors=True)

    def _write_failed(
        self, step: int, tmp_dir: Path, error: OSError | None, detail: str = ""
    ) -> None:
        if self.dist.is_main:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        if error is None:
            cause = "another rank could not write its part"
        else:
            code = errno.errorcode.get(error.errno or 0, str(error.errno))
            cause = f"{code} ({error.strerror}) at {error.filename or tmp_dir}{detail}"
        raise RunFailed(f"could not write checkpoint step-{step}: {cause}; {self._kept()}")

    def _finish(self, tmp_dir: Path, final_dir: Path, step: int, t0: float) -> None:
        self.dist.barrier()  # every rank's shards and extra state are on disk

        def publish() -> None:
            if not self.dist.is_main:
                return
            _write_synced(tmp_dir / COMPLETE, f"{step}\n")
            if final_dir.exists():
                shutil.rmtree(final_dir)
            os.replace(tmp_dir, final_dir)
            _fsync_dir(self.root)
            _write_synced(self.root / "latest", final_dir.name)
            self._prune(step)
            log.info("saved checkpoint %s in %.2f s", final_dir, time.perf_counter() - t0)

        self._agreed_write(publish, step, tmp_dir)

    def poll(self) -> None:
        """Finalise a pending async save once every rank's write has finished (collective)."""
        if self._pending is None:
            return
        if self.dist.any_true(not self._pending.future.done()):
            return
        self.wait()

    def wait(self) -> None:
        """Finish a pending asynchronous save (blocks until written; collective)."""
        from torch.distributed.checkpoint.api import CheckpointException

        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        try:
            pending.future.result()
        except (Exception, CheckpointException) as exc:
            self._raise_if_disk_error(exc, pending.step, pending.tmp_dir)
            raise
        self._finish(pending.tmp_dir, pending.final_dir, pending.step, pending.started)

    def _prune(self, saved_step: int) -> None:
        """Remove stale temp folders and all but the ``keep_last`` newest complete checkpoints
        up to ``saved_step``: newer ones belong to a run this one resumed before (e.g. one
        skipped as unreadable) and stay until a save of the same step replaces them."""
        for tmp in self.root.glob(f"{TMP_PREFIX}*"):
            if self._pending is None or tmp != self._pending.tmp_dir:
                shutil.rmtree(tmp, ignore_errors=True)
        keep = self.cfg.keep_last
        if not keep:
            return
        upto = [c for c in complete_checkpoints(self.root) if step_of_name(c) <= saved_step]
        for old in upto[:-keep]:
            shutil.rmtree(old, ignore_errors=True)

    # -- load ---------------------------------------------------------------------------------

    @property
    def _explicit(self) -> bool:
        return self.cfg.resume not in ("auto", "none")

    def _candidates(self) -> list[Path]:
        """Checkpoints to resume from, in order of preference: the explicit one, or ``latest``
        (else the newest complete one) and then the older complete ones, newest first."""
        resume = self.cfg.resume
        if resume == "none":
            return []
        if self._explicit:
            try:
                return [resolve_checkpoint(resume)]
            except UserError as exc:
                raise UserError(f"$.checkpoint.resume: {exc}") from None
        first = find_resume_checkpoint(self.root)
        if first is None:
            return []
        older = [c for c in complete_checkpoints(self.root) if c != first]
        older = [c for c in older if step_of_name(c) < step_of_name(first)]
        return [first, *reversed(older)]

    def _problem(self, path: Path) -> str | None:
        """Why ``path`` cannot be loaded, agreed by all ranks (collective); None if readable."""
        problem = None
        try:
            check_shards(path)
            read_extra_state(path, self.dist.rank)
            read_identity(path)
        except CheckpointUnreadable as exc:
            problem = exc.reason
        if self.dist.any_true(problem is not None):
            return problem or "unreadable on another rank"
        return None

    def _first_readable(
        self, candidates: list[Path], skipped: list[tuple[Path, str]]
    ) -> Path | None:
        """The first readable one of ``candidates``; warns of each unreadable one skipped
        (:class:`UserError` for an explicit path, or when none is readable)."""
        chosen = None
        for path in candidates:
            problem = self._problem(path)
            if problem is None:
                chosen = path
                break
            skipped.append((path, problem))
        if not skipped:
            return chosen
        if self._explicit:
            path, problem = skipped[0]
            raise UserError(f"$.checkpoint.resume: {problem}: checkpoint {path.name} is unreadable")
        if chosen is None:
            listed = "; ".join(f"{p.name}: {why}" for p, why in skipped)
            raise UserError(
                f"$.checkpoint.resume: no readable checkpoint in {self.root} ({listed}); "
                'repair or move them, or start afresh with resume = "none" or another output_dir'
            )
        if self.dist.is_main:
            for path, problem in skipped:
                log.warning(
                    "checkpoint %s is unreadable (%s): falling back to %s",
                    path.name,
                    problem,
                    chosen.name,
                )
        return chosen

    def resume_path(self) -> Path | None:
        """The checkpoint to resume from, per ``[checkpoint] resume``: the first readable
        candidate (collective). Chosen once: later calls return the same."""
        if self._resume is None:
            self._resume = (self._first_readable(self._candidates(), []),)
        return self._resume[0]

    def check_resume(self, trainer: CheckpointedRun) -> Path | None:
        """The checkpoint :meth:`maybe_resume` will load (see :meth:`resume_path`), its model
        checked against ``trainer``'s: :class:`UserError` naming what differs (collective)."""
        path = self.resume_path()
        if path is not None:
            self._check_identity(trainer, path, self._app_state()["model"])
        return path

    def maybe_resume(self, trainer: CheckpointedRun) -> Path | None:
        """Load the checkpoint chosen by :meth:`resume_path`, if any; under ``auto`` one that
        fails to load gives way to the previous complete one."""
        path = self.resume_path()
        while path is not None:
            try:
                self.load(trainer, path)
                return path
            except CheckpointUnreadable as exc:
                candidates = self._candidates()
                rest = candidates[candidates.index(path) + 1 :] if path in candidates else []
                path = self._first_readable(rest, [(path, exc.reason)])
                self._resume = (path,)
        return None

    def _check_identity(
        self, trainer: CheckpointedRun, path: Path, model_state: Mapping[str, Any]
    ) -> None:
        """:class:`UserError` naming what differs when ``path`` holds another model."""
        saved = read_identity(path)
        if saved is None:
            if self.dist.is_main:
                log.info(
                    "%s has no %s (an older checkpoint): its model is not checked", path, MODEL_FILE
                )
            return
        diffs = saved.differences(self._identity(trainer, model_state))
        if diffs:
            raise UserError(
                f"$.model: checkpoint {path} holds another model ({'; '.join(diffs)}); resume "
                'it with the [model] it was saved with, or train afresh: resume = "none", or '
                "another output_dir"
            )

    def load(self, trainer: CheckpointedRun, path: Path) -> None:
        """Restore model, optimizer, scheduler, data position, RNG and plugin state.

        :class:`UserError` when ``path`` holds another model; :class:`CheckpointUnreadable`
        when its files cannot be read.
        """
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException
        from torch.distributed.checkpoint.state_dict import set_state_dict

        t0 = time.perf_counter()
        extra = read_extra_state(path, self.dist.rank)
        app = self._app_state()
        self._check_identity(trainer, path, app["model"])
        try:
            with _quiet_single_process():
                dcp.load(app, checkpoint_id=str(path))
        except (Exception, CheckpointException) as exc:
            raise CheckpointUnreadable(path, _one_line(exc)) from exc
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=app["model"],
            optim_state_dict=app["optimizer"],
            options=self._options(),
        )
        trainer.state.load_dict(extra["train_state"])
        self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        self.dataloaders.train.load_state_dict(extra["dataloader"])
        saved_world = extra.get("world_size")
        if saved_world == self.dist.world_size:
            _set_rng_state(extra["rng"])
        elif self.dist.is_main:
            log.info(
                "checkpoint saved on %s ranks, resuming on %d: RNG streams start from the seed",
                saved_world,
                self.dist.world_size,
            )
        trainer.host.fire(
            "on_load_checkpoint",
            trainer=trainer,
            state=trainer.state,
            plugin_state=extra["plugin_state"],
        )
        self.last_saved_step = trainer.state.global_step
        self.last_load_s = time.perf_counter() - t0
        if self.dist.is_main:
            log.info(
                "resumed from %s (step %d) in %.2f s",
                path,
                trainer.state.global_step,
                self.last_load_s,
            )
