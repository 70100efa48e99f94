"""The trainer: build stages in a fixed order, then the step loop (docs/architecture.md).

Setup is the ordered list of build-stage hook calls (:data:`hyper_core.hookspecs.BUILD_STAGES`);
after each, ``on_stage_end`` fires. The step: fetch all micro-batches → ``on_step_begin`` →
per micro-batch forward/backward with the loss normalised by the global count of loss tokens →
clip → optimizer and scheduler step → ``global_step += 1`` → ``on_step_end`` → log → evaluate →
checkpoint. A step whose loss or gradient norm is not finite skips the optimizer update (see
:meth:`Trainer.train_step`); ``[training] max_bad_steps`` of them in a row raise
:class:`TrainingDiverged`.
"""

from __future__ import annotations

import logging
import math
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..attention.counts import AttentionCounts, counting
from ..errors import ConfigError, RunFailed
from ..hookspecs import BUILD_STAGES
from ..parallel.checkpointing import RecomputeShare, recompute_share
from ..parallel.context_parallel import split_micro_batch
from ..step.chunked_loss import chunked_causal_lm_loss, lm_head_returns_hidden
from ..step.grad_norm import clip_grads, total_grad_norm
from ..step.label_positions import keep_label_positions, supports_label_positions
from ..step.label_rows import install_label_rows
from ..step.lockstep import Lockstep
from ..step.loss import causal_lm_loss
from ..step.precision import warn_pure_bf16
from .metrics import MetricsWriter, StepTimer, fire_tracking_keys
from .peak_flops import compute_dtype, device_peak_flops
from .state import TrainState
from .watchdog import StepWatchdog

if TYPE_CHECKING:
    from ..config import Config
    from ..parallel.load_plan import LoadPlan
    from ..plugins.manager import PluginHost

log = logging.getLogger("hyper_train")


class TrainingDiverged(RunFailed):
    """``max_bad_steps`` steps in a row had a non-finite loss or gradient norm: a failed run
    (exit 1), reported by the CLI as one line. Nothing was saved or exported for it."""


class Trainer:
    """One training run. ``Trainer(config, host).train()`` builds everything and trains."""

    def __init__(self, config: Config, host: PluginHost) -> None:
        self.config = config
        #: The host as this run sees it: its stages and events skip other runs' objects.
        self.host = host.for_run()
        self.registries = host.registries
        self.state = TrainState()
        self.built: list[str] = []
        self.metrics_writer: MetricsWriter | None = None
        self.last_eval: dict[str, Any] = {}
        # Objects the build stages produce (set in setup()).
        self.dist: Any = None
        self.adapter: Any = None
        #: How the weights reach each rank (the ``plan_load`` stage's frozen plan).
        self.load_plan: LoadPlan | None = None
        self.model: Any = None
        self.loss_fn: Any = None
        self.assets: Any = None
        self.transform: Any = None
        self.datasets: Any = None
        self.runtime: Any = None
        self.strategy: Any = None
        self.collate_fn: Any = None
        self.dataloaders: Any = None
        self.get_batch: Any = None
        self.label_positions = False
        #: The share of each tower's units that backward recomputes (hardware FLOPs, HFU).
        self.recompute = RecomputeShare()
        self.loss_chunk_tokens: int | None = None
        self.train_iters: int = 0
        self.optimizer: Any = None
        self.lr_scheduler: Any = None
        self.training_context: Any = None
        self.checkpointer: Any = None
        self.callbacks: list[Any] = []
        #: Pads the ranks' micro-batch schedules (train and eval) to the same length.
        self.lockstep: Any = None
        self.evaluator: Any = None
        self._stop_signals = 0
        self._compiles: dict[str, int] = {}
        #: Attention calls on the kernel the config asked for, and fallbacks by reason.
        self.attention_counts: AttentionCounts | None = None
        self._first_stop_at = 0.0
        self.watchdog: StepWatchdog | None = None

    # -- setup --------------------------------------------------------------------------------

    def device_batch(self, micro_batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """``get_batch`` of the micro-batch, its label positions marked first (on the host,
        so the mask costs no device sync) when the model computes logits only there."""
        if self.label_positions:
            micro_batch = keep_label_positions(micro_batch)
        return self.get_batch(micro_batch)

    def _stage(self, stage: str, **kwargs: Any) -> Any:
        result = self.host.call_stage(stage, **kwargs)
        if result is None:
            raise RuntimeError(f"build stage {stage!r} returned nothing (no implementation)")
        self.built.append(stage)
        self.host.fire("on_stage_end", stage=stage, result=result, trainer=self)
        return result

    def setup(self) -> None:
        """Run every build stage in order. The per-run plugin objects stay registered until
        :meth:`train` ends (or until a stage fails)."""
        try:
            self._setup()
        except BaseException:
            self._unregister_callbacks()
            raise

    def _setup(self) -> None:
        from ..batching.resolve import resolve_runtime
        from ..config.world import context_parallel_problem
        from ..resolve import resolve_adapter, resolve_strategy

        cfg = self.config
        self.dist = self._stage("setup_distributed", config=cfg)
        self.lockstep = Lockstep(self.dist)
        self.adapter = resolve_adapter(cfg.model, self.registries)
        self.adapter.parse_options(cfg.model)  # [model.options], before anything is built
        self.strategy = resolve_strategy(cfg, self.registries)
        problem = context_parallel_problem(cfg, self.strategy)
        if problem is not None:
            raise ConfigError([problem])
        self._build_callbacks()
        # Rank 0 builds the model in full and the others on meta when the strategy broadcasts
        # it; every rank on meta when each reads its own shards of [model] path.
        self.load_plan = self._stage(
            "plan_load", config=cfg, adapter=self.adapter, dist=self.dist, strategy=self.strategy
        )
        self.model = self._stage(
            "build_model", config=cfg, adapter=self.adapter, dist=self.dist, load=self.load_plan
        )
        self.model = self._stage(
            "parallelize_model",
            config=cfg,
            model=self.model,
            adapter=self.adapter,
            dist=self.dist,
            strategy=self.strategy,
            load=self.load_plan,
        )
        self.loss_fn = self._stage("build_loss", config=cfg, adapter=self.adapter)
        self.assets = self._stage("build_model_assets", config=cfg, adapter=self.adapter)
        self.transform = self._stage(
            "build_data_transform", config=cfg, adapter=self.adapter, assets=self.assets
        )
        self.datasets = self._stage(
            "build_dataset",
            config=cfg,
            transform=self.transform,
            dist=self.dist,
            registries=self.registries,
        )
        self.runtime = resolve_runtime(
            cfg, self.adapter, self.assets, self.registries, vision_filler=self._needs_filler()
        )
        self.collate_fn = self._stage(
            "build_collate_fn", config=cfg, runtime=self.runtime, assets=self.assets
        )
        self.dataloaders = self._stage(
            "build_dataloader",
            config=cfg,
            datasets=self.datasets,
            collate_fn=self.collate_fn,
            dist=self.dist.data_view(),  # the ranks of a [parallel] cp group read the same rows
        )
        self.get_batch = self._stage(
            "build_get_batch", config=cfg, runtime=self.runtime, dist=self.dist
        )
        # The LM head runs on label positions only (training and evaluation alike)...
        self.label_positions = supports_label_positions(self.adapter, self.unwrapped_model)
        if self.label_positions:  # ...and so does the rest of the last decoder layer
            model = self.unwrapped_model
            install_label_rows(model, self.adapter.label_row_modules(model))
        try:
            model = self.unwrapped_model
            self.recompute = recompute_share(model, self.adapter.parallel_plan(model))
        except NotImplementedError:  # no plan, no units: nothing is recomputed
            pass
        # ...and in recomputed chunks when there are many (training, the default loss only).
        self.loss_chunk_tokens = (
            cfg.training.loss_chunk_tokens
            if self.label_positions and self.loss_fn is causal_lm_loss
            else None
        )
        self.train_iters = int(
            self._stage(
                "compute_train_iters", config=cfg, dataloaders=self.dataloaders, dist=self.dist
            )
        )
        self.optimizer = self._stage("build_optimizer", config=cfg, model=self.model)
        warn_pure_bf16(cfg, self.model, self.dist)  # once, at start (a collective)
        self.lr_scheduler = self._stage(
            "build_lr_scheduler",
            config=cfg,
            optimizer=self.optimizer,
            train_iters=self.train_iters,
        )
        self.training_context = self._stage(
            "build_training_context", config=cfg, model=self.model, dist=self.dist
        )
        self.evaluator = self._stage(
            "build_evaluator",
            config=cfg,
            dist=self.dist,
            adapter=self.adapter,
            strategy=self.strategy,
            model=self.model,
            loss_fn=self.loss_fn,
            assets=self.assets,
            dataloaders=self.dataloaders,
            get_batch=self.device_batch,
            training_context=self.training_context,
            lockstep=self.lockstep,
        )
        self.checkpointer = self._stage(
            "build_checkpointer",
            config=cfg,
            dist=self.dist,
            model=self.model,
            optimizer=self.optimizer,
            lr_scheduler=self.lr_scheduler,
            dataloaders=self.dataloaders,
        )
        assert tuple(self.built) == BUILD_STAGES, self.built

    def _build_callbacks(self) -> None:
        """Collect every plugin's per-run objects and register them for this run (unregistered
        in :meth:`_teardown`); they already receive this stage's ``on_stage_end``."""
        results = self.host.call_stage(
            "build_callbacks", config=self.config, dist=self.dist, adapter=self.adapter
        )
        for result in results:
            for callback in result if isinstance(result, list | tuple) else [result]:
                if callback is not None and self.host.register(callback):
                    self.callbacks.append(callback)
        self.built.append("build_callbacks")
        self.host.fire("on_stage_end", stage="build_callbacks", result=self.callbacks, trainer=self)

    def _needs_filler(self) -> bool:
        """Whether batching adds a vision filler: several ranks train a model with a vision
        encoder, and no per-run object runs the encoder on every rank itself."""
        if self.dist.world_size == 1:
            return False
        if self.adapter.parallel_plan(self.unwrapped_model).vision_encoder is None:
            return False
        return not any(
            getattr(cb, "runs_vision_encoder_on_every_rank", False) for cb in self.callbacks
        )

    @property
    def unwrapped_model(self) -> Any:
        """The model without DDP wrapping."""
        return self.strategy.unwrap(self.model) if self.strategy is not None else self.model

    # -- the loop -----------------------------------------------------------------------------

    def train(self) -> TrainState:
        """Build (if needed) and train until ``train_iters`` steps or a stop signal."""
        try:
            if not self.built:
                self.setup()
            self.attention_counts = AttentionCounts(self.dist.device)
            with counting(self.attention_counts):
                return self._train()
        except BaseException as exc:
            self._fire_error(exc)
            raise
        finally:
            self._teardown()

    def _train(self) -> TrainState:
        cfg = self.config
        if cfg.training.compile:
            from ..parallel.compile import compile_counts

            self._compiles = compile_counts()  # this run's compiles are counted from here
        self.checkpointer.maybe_resume(self)
        if self.dist.is_main:
            self.metrics_writer = MetricsWriter(
                cfg.run.output_dir, tensorboard=cfg.logging.tensorboard
            )
        self._install_signal_handlers()
        self.watchdog = watchdog = StepWatchdog(
            rank=self.dist.rank,
            stall_timeout_s=cfg.training.stall_timeout_s,
            stacks_dir=Path(cfg.run.output_dir) / "stacks",
        )
        watchdog.start(self.state.global_step)
        self.host.fire("on_train_begin", trainer=self, state=self.state)
        loader = self.dataloaders.train
        data: Iterator[Any] = iter(loader)
        epoch_started: int | None = None
        timer = StepTimer(device_peak_flops(self.dist.device, compute_dtype(cfg)))
        stop = False
        try:
            while self.state.global_step < self.train_iters and not stop:
                watchdog.enter("data")
                timer.start_wait()
                step_batch = next(data)
                timer.end_wait()
                if epoch_started != step_batch.epoch:
                    if epoch_started is not None:
                        self.host.fire(
                            "on_epoch_end", trainer=self, state=self.state, epoch=epoch_started
                        )
                    epoch_started = step_batch.epoch
                    self.state.epoch = step_batch.epoch
                    self.host.fire(
                        "on_epoch_begin", trainer=self, state=self.state, epoch=step_batch.epoch
                    )
                watchdog.enter("step")
                loss, loss_dict, grad_norm, stats = self.train_step(step_batch)
                watchdog.finished(self.state.global_step)
                watchdog.enter("log")
                timer.add_step(stats)
                self.host.fire(
                    "on_step_end",
                    trainer=self,
                    state=self.state,
                    loss=loss,
                    loss_dict=loss_dict,
                    grad_norm=grad_norm,
                )
                if self.state.bad_streak >= cfg.training.max_bad_steps:
                    self._log(loss, loss_dict, grad_norm, timer)
                    raise TrainingDiverged(self._divergence_message(loss, grad_norm))
                stop = self._agree_stop()
                step = self.state.global_step
                last = step >= self.train_iters or stop
                if step % cfg.logging.every_steps == 0 or last:
                    self._log(loss, loss_dict, grad_norm, timer)
                if (
                    cfg.training.eval_every_steps
                    and step % cfg.training.eval_every_steps == 0
                    and not last
                ):
                    watchdog.enter("eval")
                    self.evaluate()
                # A stop (signal, plugin) always saves; the normal end unless save_final = false.
                final = stop or (last and cfg.checkpoint.save_final)
                watchdog.enter("checkpoint")
                self.checkpointer.maybe_save(self, final=final)
        finally:
            # The iterator holds the loader's worker processes: shut them down now, not
            # whenever the garbage collector reaches it (each join waits up to 5 s).
            close = getattr(data, "close", None)
            if close is not None:
                close()
        watchdog.stop()  # what follows (final evaluation, export) has no steps to watch
        if epoch_started is not None and loader_epoch_done(loader):
            self.host.fire("on_epoch_end", trainer=self, state=self.state, epoch=epoch_started)
        if self.dataloaders.eval is not None and not stop:
            self.evaluate()
        self.checkpointer.wait()
        if cfg.checkpoint.export_hf and self.state.global_step >= self.train_iters:
            from ..export import export_at_end

            export_at_end(self, Path(cfg.run.output_dir) / "hf")
        if cfg.training.compile and self.dist.is_main:
            from ..parallel.compile import compiles_since

            log.info("%s", compiles_since(self._compiles).summary())
        counts = self.attention_counts
        if counts is not None and self.dist.is_main and (counts.kernel_calls or counts.fallbacks):
            log.info("attention (%s): %s", cfg.model.attn_implementation, counts.summary())
        self.host.fire("on_train_end", trainer=self, state=self.state)
        return self.state

    def _agree_stop(self) -> bool:
        """Whether to stop after this step: any rank's ``state.stop_requested`` (SIGTERM or a
        plugin), agreed by all ranks at the same step so that collectives stay matched."""
        stop = self.dist.any_true(self.state.stop_requested)
        if stop:  # never reset: a signal may land between the collective and here
            self.state.stop_requested = True
        return stop

    def _divergence_message(self, loss: float, grad_norm: float | None) -> str:
        step, streak = self.state.global_step, self.state.bad_streak
        steps = f"step {step}" if streak == 1 else f"steps {step - streak + 1}-{step}"
        return (
            f"training diverged: {streak} steps in a row had a non-finite loss or gradient norm "
            f"({steps}; last: loss {loss}, grad norm {grad_norm}); stopped at step {step} "
            "without saving a checkpoint (`latest` is unchanged); lower [training] lr, or "
            "raise [training] max_bad_steps"
        )

    def train_step(
        self, step_batch: Any
    ) -> tuple[float, dict[str, float], float | None, dict[str, Any]]:
        """One optimizer step over the micro-batches of ``step_batch``.

        A step whose loss (summed over ranks) or global gradient norm is not finite is *bad*:
        every rank sees the same reduced values, so all skip ``optimizer.step()`` together;
        the gradients are dropped. The LR scheduler, ``global_step`` and the data position
        still advance (as for Megatron-LM's skipped iterations, the step's data is consumed
        and the step counts against ``steps``): the learning rate stays the schedule's value
        at ``global_step``, and a run resumed from any checkpoint replays the same steps.
        ``state.bad_steps`` and ``state.bad_streak`` count them.
        """
        import torch

        micro_batches = list(step_batch.micro_batches)
        for reason, n in step_batch.skipped.items():
            self.state.skipped[reason] = self.state.skipped.get(reason, 0) + n
        self.host.fire("on_step_begin", trainer=self, state=self.state, micro_batches=micro_batches)
        dist = self.dist
        schedule = self.lockstep.schedule(micro_batches)
        # Host counts summed on the host (no wait for the device). The cp ranks of a group
        # count the same rows' tokens; FSDP2 averages gradients over every rank of its mesh,
        # and each rank's loss is a partial sum: × world size.
        local_loss_tokens = float(sum(mb.num_loss_tokens for mb in micro_batches))
        global_loss_tokens = max(dist.sum_float(local_loss_tokens) / dist.cp, 1.0)
        grad_scale = float(dist.world_size)
        model = self.model
        model.train()
        loss_total = torch.zeros((), dtype=torch.float64, device=dist.device)
        loss_parts: dict[str, torch.Tensor] = {}
        forward_kwargs = self.adapter.forward_kwargs()
        for i, (mb, weight) in enumerate(schedule):
            with self.strategy.no_sync(model, last_micro_step=i == len(schedule) - 1):
                loss, parts = self._forward_loss(mb, forward_kwargs, global_loss_tokens)
                if weight != 1.0:
                    loss = loss * weight
                (loss * grad_scale).backward()
            loss_total += loss.detach().to(torch.float64)
            for k, v in parts.items():
                loss_parts[k] = (
                    loss_parts.get(k, 0) + torch.as_tensor(v, dtype=torch.float64).detach() * weight
                )
            self.host.fire(
                "on_micro_step_end",
                trainer=self,
                state=self.state,
                micro_step=i,
                loss=loss.detach(),
            )
            del loss
        norm = self._grad_norm()
        # One collective: the loss summed over ranks (non-finite on every rank if it is on
        # one) and how many ranks see a non-finite gradient norm; then one host sync for it
        # and the norm together (a GPU step waits on the host once here, not twice).
        norm_bad = torch.zeros_like(loss_total) if norm is None else (~norm.isfinite()).double()
        reduced = dist.all_reduce_sum(torch.stack([loss_total, norm_bad]))
        if norm is not None:
            reduced = torch.cat([reduced, norm.detach().double().reshape(1).to(reduced.device)])
        loss_value, bad_norms, *norm_value = reduced.tolist()
        grad_norm = norm_value[0] if norm_value else None
        self.state.global_step += 1
        if math.isfinite(loss_value) and not bad_norms:
            self._clip_gradients(norm)
            self.optimizer.step()
            self.lr_scheduler.step()
            self.state.bad_streak = 0
        else:
            self._skip_update(loss_value, grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        n_samples = sum(mb.num_samples for mb in micro_batches)
        n_tokens = sum(mb.num_tokens for mb in micro_batches)
        self.state.samples_seen += n_samples
        self.state.tokens_seen += n_tokens
        once = dist.cp_rank == 0  # the ranks of a [parallel] cp group share their rows
        stats = {
            "tokens": n_tokens if once else 0,
            "padding": sum(mb.num_padding for mb in micro_batches) if once else 0,
            "samples": n_samples,
            "loss_tokens": global_loss_tokens,
        }
        stats["flops"], stats["hardware_flops"] = self._flops(micro_batches) if once else (0, 0)
        loss_dict = {k: float(v) for k, v in loss_parts.items()}
        return loss_value, loss_dict, grad_norm, stats

    def _forward_loss(
        self, mb: Any, forward_kwargs: dict[str, Any], global_loss_tokens: float
    ) -> tuple[Any, dict[str, Any]]:
        """One micro-batch's forward and loss (``loss_fn``, or the chunked cross-entropy when
        its label tokens exceed ``[training] loss_chunk_tokens``); the device batch is
        released on return."""
        if self.dist.cp > 1:
            mb = split_micro_batch(mb, self.dist)  # this rank's labels of [parallel] cp
        model_inputs, loss_inputs = self.device_batch(mb)
        chunk = self.loss_chunk_tokens
        if chunk is None or mb.num_loss_tokens <= chunk:
            with self.training_context():
                outputs = self.model(**model_inputs, **forward_kwargs)
            return self.loss_fn(outputs, loss_inputs, global_loss_tokens)
        with self.training_context(), lm_head_returns_hidden(self.unwrapped_model) as head:
            hidden = self.model(**model_inputs, **forward_kwargs).logits
        loss = chunked_causal_lm_loss(
            hidden, head, loss_inputs["labels"], global_loss_tokens, chunk, self.training_context
        )
        return loss, {}

    def _skip_update(self, loss: float, grad_norm: float | None) -> None:
        """A bad step: no optimizer update; the schedule still advances (see train_step)."""
        self.state.bad_steps += 1
        self.state.bad_streak += 1
        with warnings.catch_warnings():
            # torch warns when the scheduler steps before any optimizer.step(): deliberate here.
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.lr_scheduler.step()
        if self.dist.is_main:
            bad = [] if math.isfinite(loss) else [f"loss ({loss})"]
            if grad_norm is not None and not math.isfinite(grad_norm):
                bad.append(f"grad norm ({grad_norm})")
            log.warning(
                "step %d: non-finite %s; update skipped (%d in a row; the run stops at %d)",
                self.state.global_step,
                " and ".join(bad) or "grad norm on another rank",
                self.state.bad_streak,
                self.config.training.max_bad_steps,
            )

    def _grad_norm(self) -> Any:
        """Global L2 norm of the gradients (a 0-d tensor); None when no parameter has one.

        Sharded (DTensor) gradients give a partial norm per rank, reduced over their meshes
        (:mod:`hyper_core.step.grad_norm`), so every rank gets the norm of the whole model
        (DDP gradients are already all-reduced replicas).
        """
        return total_grad_norm(self.model.parameters())

    def _clip_gradients(self, norm: Any) -> None:
        """Scale the gradients so that their global norm ``norm`` is at most ``max_grad_norm``."""
        max_norm = self.config.training.max_grad_norm
        if max_norm is None or norm is None:
            return
        clip_grads(self.model.parameters(), max_norm, norm)

    def _flops(self, micro_batches: list[Any]) -> tuple[float, float]:
        """Model FLOPs (MFU) and hardware FLOPs (HFU: recomputation included) of a step."""
        try:
            model = self.unwrapped_model
            counts = [self.adapter.flops(model, mb) for mb in micro_batches]
        except NotImplementedError:
            return 0.0, 0.0
        share = self.recompute
        hardware = sum(c.hardware(share.text, share.vision) for c in counts)
        return float(sum(c.total for c in counts)), float(hardware)

    # -- logging and evaluation ---------------------------------------------------------------

    def _log(
        self, loss: float, loss_dict: dict[str, float], grad_norm: float | None, timer: StepTimer
    ) -> None:
        metrics: dict[str, Any] = {
            "step": self.state.global_step,
            "epoch": self.state.epoch,
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
        }
        metrics.update(timer.flush(self.dist))
        counts = self.attention_counts
        if counts is not None and (counts.fallbacks or counts.kernel_calls):
            metrics.update(counts.metrics())
        if self.state.skipped:
            metrics["skipped"] = dict(self.state.skipped)
        if self.state.bad_steps:
            metrics["bad_steps"] = self.state.bad_steps
        added_by = fire_tracking_keys(self.host, "on_log", metrics, trainer=self, state=self.state)
        if self.metrics_writer is not None:
            self.metrics_writer.write(metrics, added_by=added_by)

    def evaluate(self) -> dict[str, Any]:
        """Run the evaluator (``build_evaluator``), write its sample generations, fire
        ``on_evaluate`` and log the metrics."""
        from .evaluate import write_samples

        metrics = dict(self.evaluator.evaluate())
        metrics["step"] = self.state.global_step
        samples = metrics.get("samples")
        if samples and self.dist.is_main:
            out = Path(self.config.run.output_dir)
            write_samples(out, self.state.global_step, samples, self.metrics_writer)
        added_by = fire_tracking_keys(
            self.host, "on_evaluate", metrics, trainer=self, state=self.state
        )
        if self.metrics_writer is not None:
            self.metrics_writer.write(
                {"eval": metrics, "step": self.state.global_step},
                added_by={f"eval.{key}": plugin for key, plugin in added_by.items()},
            )
        self.last_eval = metrics
        return metrics

    # -- errors, signals, teardown ------------------------------------------------------------

    def _fire_error(self, exc: BaseException) -> None:
        try:
            self.host.fire("on_train_error", trainer=self, state=self.state, exc=exc)
        except Exception:
            log.exception("an on_train_error hook failed")

    def _install_signal_handlers(self) -> None:
        def request_stop(signum: int, frame: Any) -> None:
            # A second signal aborts; one within a second of the first is the same stop
            # delivered twice (a terminal's Ctrl-C reaches the rank and the launcher, which
            # forwards it).
            now = time.monotonic()
            if self._stop_signals == 0:
                self._first_stop_at = now
            self._stop_signals += 1
            if now - self._first_stop_at > 1.0:
                raise KeyboardInterrupt
            self.state.stop_requested = True
            if self.dist.is_main:
                log.warning(
                    "received %s: stopping after the current step", signal.Signals(signum).name
                )

        self._old_handlers = {}
        try:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, request_stop)
        except ValueError:  # not the main thread
            self._old_handlers = {}

    def _teardown(self) -> None:
        if self.watchdog is not None:
            self.watchdog.stop()
        for sig, handler in getattr(self, "_old_handlers", {}).items():
            signal.signal(sig, handler)
        if self.metrics_writer is not None:
            self.metrics_writer.close()
            self.metrics_writer = None
        self._unregister_callbacks()

    def _unregister_callbacks(self) -> None:
        self.host.unregister_all()


def loader_epoch_done(loader: Any) -> bool:
    """Whether the loader's position is at an epoch boundary."""
    state = loader.state_dict() if hasattr(loader, "state_dict") else None
    return bool(state) and state.get("step_in_epoch", 1) == 0


def check_batch_sizes(config: Config, dp_size: int) -> int:
    """Gradient-accumulation steps; global = micro × accumulation × data-parallel size."""
    t = config.training
    per_rank, rem = divmod(t.global_batch_size, dp_size)
    if rem or per_rank % t.micro_batch_size:
        raise ConfigError(
            [
                (
                    "$.training.global_batch_size",
                    f"{t.global_batch_size} is not micro_batch_size ({t.micro_batch_size}) × "
                    f"accumulation × data-parallel size ({dp_size})",
                )
            ]
        )
    return per_rank // t.micro_batch_size
