"""One preference run: the loss, the reference log-probs, the metrics (per-run object).

It takes part in the run through documented hooks only: ``build_collate_fn`` (pairs per
micro-batch), ``build_loss``, ``build_get_batch`` (adds the reference log-probs to
``loss_inputs``), ``build_evaluator`` (pair metrics on the eval split), ``on_train_begin``
(the precompute pass), ``on_step_begin`` and ``on_log``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hyper_core import hookimpl
from hyper_core.errors import ConfigError, RunFailed

from .batching import SEQUENCE_FIELD, pair_collate
from .data import PAIR_KEY, SIDE_KEY
from .loss import REFERENCE_KEY, pair_terms, reward_sums, sequence_logps
from .reference import (
    PRECOMPUTED_FILE,
    adapters_disabled,
    load_precomputed,
    meta_copy,
    save_precomputed,
    shard_like,
)
from .vision import SharedImages

if TYPE_CHECKING:
    import torch

    from hyper_core.batching.types import MicroBatch

    from .config import PreferenceConfig

log = logging.getLogger("hyper_train.preference")

GetBatch = Callable[[Any], tuple[dict[str, Any], dict[str, Any]]]


def reward_metrics(sums: list[float]) -> dict[str, float]:
    """The logged metrics of :func:`~hyper_preference.loss.reward_sums` totals."""
    pairs, _loss, chosen, rejected, right, _exact = sums
    return {
        "rewards/chosen": chosen / pairs,
        "rewards/rejected": rejected / pairs,
        "rewards/margin": (chosen - rejected) / pairs,
        "rewards/accuracy": right / pairs,
    }


class PreferenceRun:
    """The per-run state of a ``[preference]`` run."""

    def __init__(self, cfg: PreferenceConfig, config: Any) -> None:
        self.cfg = cfg
        self.config = config
        peft = config.section("peft")
        lora = peft is not None and getattr(peft, "enabled", False)
        self.mode = cfg.reference_mode(lora) if cfg.uses_reference else None
        parallel = config.parallel
        if self.mode == "copy" and (parallel.cp > 1 or parallel.ep > 1):
            raise ConfigError(
                [
                    (
                        "$.preference.reference",
                        "a frozen copy is not split for [parallel] cp or ep yet: use "
                        '"precompute", or [peft] adapters ("adapters_off")',
                    )
                ]
            )
        if self.mode == "adapters_off" and not lora:
            raise ConfigError(
                [("$.preference.reference", '"adapters_off" needs [peft] method = "lora"')]
            )
        self.trainer: Any = None
        self.reference_model: torch.nn.Module | None = None
        self.precomputed: dict[str, tuple[float, float]] | None = None
        #: During the precompute pass the reference is the policy itself (its first weights).
        self.precomputing = False
        self.phase = "train"
        #: Running reward sums since the last log (train) or in this evaluation.
        self.sums: dict[str, torch.Tensor | None] = {"train": None, "eval": None}
        #: Micro-batches of this step already counted (a lockstep repeat is not).
        self._seen: set[int] = set()
        self._count_current = True
        #: The vision encoder whose inputs both sides of a pair share (see vision.py).
        self.vision: Any = None
        self.shared_images: SharedImages | None = None

    # -- build stages ---------------------------------------------------------------------------

    @hookimpl
    def on_stage_end(self, stage: str, result: Any, trainer: Any) -> None:
        """Keep the trainer; the frozen copy of the starting weights once the model is built
        (before any step or resume), and before the trainer has the last layer run on the
        label rows only: that wrapper reads its model's own forward's mask, which a copy
        would not share."""
        self.trainer = trainer
        sharded = self.mode == "copy" and self._shards(trainer)
        if stage == "build_model" and sharded:
            self.reference_model = meta_copy(result)  # before the strategy shards the policy
        if stage != "build_get_batch":
            return
        if sharded:
            plan = trainer.adapter.parallel_plan(trainer.unwrapped_model)
            strategy = trainer.strategy
            # encoder_parallel wraps its base strategy (fsdp2), whose policy this is
            policy_of = getattr(strategy, "mixed_precision", None) or strategy.base.mixed_precision
            model = trainer.unwrapped_model
            shard_like(self.reference_model, model, plan, trainer.dist, policy_of())
        elif self.mode == "copy":
            self.reference_model = copy.deepcopy(trainer.unwrapped_model).requires_grad_(False)
        if self.vision is not None:
            self.shared_images = SharedImages(trainer.adapter, self.vision)
            for model in (trainer.unwrapped_model, self.reference_model):
                if model is not None:
                    self.shared_images.install(model)

    @staticmethod
    def _shards(trainer: Any) -> bool:
        """Whether the policy is sharded by fsdp2 (the copy is then sharded like it)."""
        strategy = trainer.strategy
        shards = getattr(strategy, "shards_parameters", False) or strategy.name == "fsdp2"
        return trainer.dist.world_size > 1 and shards

    def _shared_vision(self, runtime: Any) -> Any:
        """The vision encoder spec when a pair's images can be encoded once, else None."""
        from hyper_core.types import VisionEncoderAdapter

        trainer = self.trainer
        adapter = trainer.adapter
        if not self.cfg.encode_images_once or not isinstance(adapter, VisionEncoderAdapter):
            return None
        spec = adapter.parallel_plan(trainer.unwrapped_model).vision_encoder
        ep = self.config.section("encoder_parallel")
        filler = runtime.vision_filler
        if (
            spec is None
            or len(spec.input_keys) < 2
            or spec.meta_keys  # per-image metadata (tiles) the pre-hook does not carry
            or trainer.dist.cp > 1
            or (ep is not None and getattr(ep, "enabled", False))
            or self.config.parallel.strategy == "encoder_parallel"
            or (filler is not None and filler.num_videos)
        ):
            return None
        return spec

    @hookimpl(wrapper=True)
    def build_collate_fn(self, config: Any, runtime: Any) -> Generator[None, Any, Any]:
        """Both sides of a pair in one micro-batch (see :mod:`hyper_preference.batching`)."""
        inner = yield
        self.vision = self._shared_vision(runtime)
        return pair_collate(inner, runtime, self.vision)

    @hookimpl
    def build_loss(self) -> Callable[..., Any]:
        """The pair objective of ``[preference] loss``."""
        return self.loss_fn

    @hookimpl(wrapper=True)
    def build_get_batch(self) -> Generator[None, Any, GetBatch]:
        """The run's ``get_batch``, with the reference log-probs added to ``loss_inputs``."""
        inner = yield

        def get_batch(micro_batch: MicroBatch) -> tuple[dict[str, Any], dict[str, Any]]:
            model_inputs, loss_inputs = inner(micro_batch)
            marker = id(micro_batch.loss_inputs[SEQUENCE_FIELD])
            self._count_current = marker not in self._seen
            self._seen.add(marker)
            if self.mode is not None:
                loss_inputs[REFERENCE_KEY] = self.reference_logps(
                    micro_batch, model_inputs, loss_inputs
                )
            return model_inputs, loss_inputs

        return get_batch

    @hookimpl(wrapper=True)
    def build_evaluator(self) -> Generator[None, Any, Any]:
        """The core's evaluation, with the pair metrics and the pairs' mean loss."""
        inner = yield
        return PreferenceEvaluator(inner, self)

    # -- the loss -------------------------------------------------------------------------------

    def loss_fn(
        self, outputs: Any, loss_inputs: dict[str, Any], num_loss_tokens: float
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """Σ pair losses / the step's global number of pairs (the micro-batches' loss units)."""
        policy = sequence_logps(outputs.logits, loss_inputs, misses=self.phase == "eval")
        terms = pair_terms(self.cfg, policy, loss_inputs.get(REFERENCE_KEY))
        if self._count_current:
            sums = reward_sums(terms, policy)
            previous = self.sums[self.phase]
            self.sums[self.phase] = sums if previous is None else previous + sums
        return terms.losses.sum() / num_loss_tokens, {}

    # -- the reference --------------------------------------------------------------------------

    def _forward_logps(
        self, model: torch.nn.Module, model_inputs: dict[str, Any], loss_inputs: dict[str, Any]
    ) -> torch.Tensor:
        import torch

        trainer = self.trainer
        # In eval mode (no dropout), whichever the mode: the three references agree.
        training = model.training
        model.train(False)
        try:
            with torch.no_grad(), trainer.training_context():
                outputs = model(**model_inputs, **trainer.adapter.forward_kwargs())
        finally:
            model.train(training)
        return sequence_logps(outputs.logits, loss_inputs).logps

    def reference_logps(
        self, micro_batch: MicroBatch, model_inputs: dict[str, Any], loss_inputs: dict[str, Any]
    ) -> torch.Tensor:
        """``(2P,)`` reference log-probs of the micro-batch's sequences."""
        import torch

        trainer = self.trainer
        if self.mode == "copy":
            assert self.reference_model is not None
            return self._forward_logps(self.reference_model, model_inputs, loss_inputs)
        if self.mode == "adapters_off":
            with adapters_disabled(trainer.unwrapped_model):
                return self._forward_logps(trainer.unwrapped_model, model_inputs, loss_inputs)
        if self.precomputing:
            return self._forward_logps(trainer.unwrapped_model, model_inputs, loss_inputs)
        assert self.precomputed is not None
        values: list[float] = []
        for meta in micro_batch.meta:
            key, side = (meta or {}).get(PAIR_KEY), (meta or {}).get(SIDE_KEY)
            if key is None:
                continue  # the vision filler
            if key not in self.precomputed:
                raise RunFailed(
                    f"no precomputed reference log-probs for a pair (key {key}) in "
                    f"{self._precomputed_path()}: the data changed since they were written; "
                    "delete the file to compute them again from the starting weights"
                )
            values.append(self.precomputed[key][0 if side == "chosen" else 1])
        return torch.tensor(values, dtype=torch.float32, device=trainer.dist.device)

    def _precomputed_path(self) -> Path:
        return Path(self.config.run.output_dir) / PRECOMPUTED_FILE

    @hookimpl
    def on_train_begin(self, trainer: Any, state: Any) -> None:
        """``reference = "precompute"``: read the run's reference log-probs, or compute them
        with the starting weights (every rank its share of the pairs, then all of them)."""
        if self.mode != "precompute":
            return
        path = self._precomputed_path()
        if path.is_file():
            self.precomputed = load_precomputed(path)
            return
        if state.global_step > 0:
            raise RunFailed(
                f"resumed at step {state.global_step} but {path} is missing: the reference "
                "log-probs must come from the starting weights; start the run again"
            )
        self.precomputed = self._precompute(trainer)
        if trainer.dist.is_main:
            save_precomputed(path, self.precomputed)
            log.info("reference log-probs of %d pairs written to %s", len(self.precomputed), path)

    def _precompute(self, trainer: Any) -> dict[str, tuple[float, float]]:
        from hyper_core.data.dataset import Skipped

        dist = trainer.dist
        table: dict[str, tuple[float, float]] = {}
        size = self.config.training.micro_batch_size
        splits = [trainer.datasets.train, trainer.datasets.eval]
        self.precomputing = True
        try:
            for dataset in (d for d in splits if d is not None):
                mine = [dataset[i] for i in range(dist.rank, len(dataset), dist.world_size)]
                pairs = [p for p in mine if not isinstance(p, Skipped)]
                micro_batches = [
                    mb
                    for i in range(0, len(pairs), size)
                    for mb in trainer.collate_fn(pairs[i : i + size])
                ]
                for mb, weight in trainer.lockstep.schedule(micro_batches):
                    _, loss_inputs = trainer.device_batch(mb)
                    if not weight:
                        continue
                    logps = loss_inputs[REFERENCE_KEY].tolist()
                    keys = [m[PAIR_KEY] for m in mb.meta if (m or {}).get(SIDE_KEY) == "chosen"]
                    for i, key in enumerate(keys):
                        table[key] = (logps[2 * i], logps[2 * i + 1])
        finally:
            self.precomputing = False
        if dist.world_size > 1:
            import torch.distributed as tdist

            everyone: list[Any] = [None] * dist.world_size
            tdist.all_gather_object(everyone, table)
            table = {k: v for part in everyone for k, v in part.items()}
        return table

    # -- metrics --------------------------------------------------------------------------------

    @hookimpl
    def on_step_begin(self) -> None:
        self._seen.clear()

    def take(self, phase: str) -> list[float]:
        """The phase's reward sums over every rank (a collective), reset."""
        import torch

        sums = self.sums[phase]
        self.sums[phase] = None
        device = self.trainer.dist.device
        if sums is None:
            sums = torch.zeros(6, dtype=torch.float64, device=device)
        return self.trainer.dist.all_reduce_sum(sums).tolist()

    @hookimpl
    def on_log(self, trainer: Any, metrics: dict[str, Any]) -> None:
        """``rewards/*`` of the pairs trained since the last log (every rank: a collective)."""
        sums = self.take("train")
        if not sums[0]:
            return
        metrics.update(reward_metrics(sums))
        if trainer.dist.is_main and self.config.logging.progress != "none":
            log.info("step %d: %s", metrics["step"], _line(metrics))


def _line(metrics: dict[str, Any]) -> str:
    keys = [k for k in metrics if k.startswith("rewards/")]
    return ", ".join(f"{k.split('/')[1]} {metrics[k]:.4f}" for k in keys)


class PreferenceEvaluator:
    """The core's evaluator with the pairs' metrics: ``eval_loss`` is the mean pair loss,
    ``rewards/*`` as in training, and ``chosen_accuracy`` the share of chosen replies that
    greedy decoding reproduces. Per-sequence metrics of the core that mix both replies
    (``perplexity``, exact match per question type) are left out."""

    def __init__(self, inner: Any, run: PreferenceRun) -> None:
        self.inner = inner
        self.run = run

    def evaluate(self) -> dict[str, Any]:
        run = self.run
        run.sums["eval"] = None
        run._seen.clear()
        run.phase = "eval"
        try:
            metrics = dict(self.inner.evaluate())
        finally:
            run.phase = "train"
        sums = run.take("eval")
        for key in list(metrics):
            if key == "perplexity" or key.startswith(("accuracy_", "count_")):
                del metrics[key]
        if sums[0]:
            metrics["eval_loss"] = sums[1] / sums[0]
            metrics.update(reward_metrics(sums))
            metrics["chosen_accuracy"] = sums[5] / sums[0]
            metrics["eval_pairs"] = int(sums[0])
        return metrics
