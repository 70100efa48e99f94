"""The balancer reads the images' sizes and metadata from the micro-batch's host tensors: with
the run's ``get_batch`` wrapped (:meth:`EncoderBalancer.wrap_get_batch`), balancing a forward
waits for the device not once, however many images it holds; and it changes no result.

One process: the balancer's all-gather is the identity (one rank), and ``get_batch`` gives
copies of the micro-batch's tensors as a CUDA run's device copies (:mod:`ep_syncs`), so a read
of a device copy, or of anything computed from one, is told from a read of the collate's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from ep_helpers import needs_vl, tiny_vl_micro_batch, write_images
from ep_syncs import SyncCounter, device_copies, is_host

from hyper_encoder_parallel.balancer import EncoderBalancer
from hyper_encoder_parallel.config import EncoderParallelConfig

pytestmark = needs_vl

KEYS = ("pixel_values", "image_grid_thw")


def _balancer(adapter: Any, model: torch.nn.Module) -> EncoderBalancer:
    balancer = EncoderBalancer(
        model,
        adapter,
        KEYS,
        EncoderParallelConfig(enabled=True),
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
    )
    balancer._all_gather_objects = lambda value: [value]  # type: ignore[method-assign]
    return balancer


def _move(micro_batch: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return dict(micro_batch.model_inputs), dict(micro_batch.loss_inputs)


def _balanced(
    balancer: EncoderBalancer, get_batch: Any, micro_batch: Any, patch_dtype: Any = None
) -> tuple[Any, Any]:
    """The balanced forward inputs, and the device syncs counted while moving and balancing
    (the patches cast to ``patch_dtype`` in between, as FSDP2's ``param_dtype`` does)."""
    counter = SyncCounter()
    counter.patch()
    try:
        counter.start()
        try:
            model_inputs, _ = get_batch(micro_batch)
            assert not is_host(model_inputs["image_grid_thw"])  # a "device" copy
            if patch_dtype is not None:
                patches = model_inputs["pixel_values"].to(patch_dtype)
                model_inputs = {**model_inputs, "pixel_values": patches}
            kwargs = balancer.rebalance(model_inputs)
        finally:
            counter.stop()
    finally:
        counter.unpatch()
    return kwargs, counter.callers


def test_balancing_waits_for_no_device(tmp_path: Path) -> None:
    write_images(tmp_path)
    adapter, model, mb = tiny_vl_micro_batch("qwen2_5_vl", tmp_path)
    assert mb.num_images == 3
    balancer = _balancer(adapter, model)
    kwargs, callers = _balanced(balancer, balancer.wrap_get_batch(device_copies(_move)), mb)
    assert callers == []
    assert "pixel_values" not in kwargs and "mm_encoder_outputs" in kwargs
    assert balancer.stats.images_computed == 3
    # The patches cast after get_batch (a new tensor) are still this micro-batch's.
    balancer = _balancer(adapter, model)
    get_batch = balancer.wrap_get_batch(device_copies(_move))
    kwargs, callers = _balanced(balancer, get_batch, mb, patch_dtype=torch.bfloat16)
    assert callers == []
    assert kwargs["mm_encoder_outputs"]["image"].pooler_output[0].dtype == torch.float32
    # Without the host inputs (a forward not fed by the run's get_batch) the same balancing
    # reads the device: the adapter's patch counts and the records, once each.
    _, callers = _balanced(_balancer(adapter, model), device_copies(_move), mb)
    assert [c.split(":")[0] for c in callers] == [
        "hyper_core.adapters.hf",
        "hyper_encoder_parallel.vision_io",
    ]


def test_balanced_forward_gives_the_models_loss(tmp_path: Path) -> None:
    from hyper_core.step.loss import causal_lm_loss

    write_images(tmp_path)
    adapter, model, mb = tiny_vl_micro_batch("qwen2_5_vl", tmp_path)
    balancer = _balancer(adapter, model)
    model_inputs, loss_inputs = balancer.wrap_get_batch(device_copies(_move))(mb)
    kwargs = balancer.rebalance(model_inputs)
    n = mb.num_loss_tokens
    with torch.no_grad():
        ref, _ = causal_lm_loss(model(**mb.model_inputs, use_cache=False), mb.loss_inputs, n)
        loss, _ = causal_lm_loss(model(**kwargs, use_cache=False), loss_inputs, n)
    assert torch.equal(loss, ref)


def test_profiled_encoder_times_go_between_ranks_as_host_values() -> None:
    """``profile``'s per-rank encoder times are gathered as host values (over gloo), not as
    device tensors read back rank by rank."""
    settings = EncoderParallelConfig(enabled=True, profile=True)
    cpu = torch.device("cpu")
    balancer = EncoderBalancer(torch.nn.Linear(1, 1), None, KEYS, settings, 0, 2, cpu)
    sent: list[Any] = []

    def all_gather(value: Any) -> list[Any]:
        sent.append(value)
        return [value, 3 * value]  # rank 1 took 3× as long

    balancer._all_gather_objects = all_gather  # type: ignore[method-assign]
    balancer.stats.encoder_ms = 40.0
    out = balancer.flush_metrics(global_step=4)
    assert sent == [10.0]  # ms per step over the 4 steps since the last log
    assert out["encoder_parallel/encoder_ms_max"] == 30.0
    assert out["encoder_parallel/encoder_ms_mean"] == 20.0
    assert balancer.stats.encoder_ms == 0.0
