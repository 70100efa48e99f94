"""DPO loss, rewards and gradients equal TRL's ``DPOTrainer`` computation (trl, a test extra).

The same tiny text model, pairs and reference model go through the plugin's packed pair
micro-batch (logits at the label positions, as in training) and through TRL's own
``DPOTrainer._compute_loss`` on TRL's padded ``[chosen..., rejected...]`` batch with its fused
LM head.
"""

from __future__ import annotations

import copy
import types
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from pref_helpers import PLUGIN, dpo_config, write_text_pairs

from hyper_core.batching.resolve import resolve_runtime
from hyper_core.batching.types import IGNORE_INDEX
from hyper_core.config import load_config_dict
from hyper_core.resolve import resolve_adapter
from hyper_core.step.label_positions import keep_label_positions
from hyper_core.testing import isolated_host
from hyper_preference.batching import PairBatching
from hyper_preference.config import PreferenceConfig
from hyper_preference.data import PairTransform
from hyper_preference.loss import pair_terms, sequence_logps


def _pairs_and_models(tmp_path: Path) -> tuple:
    host = isolated_host([PLUGIN])
    config = load_config_dict(
        dpo_config(tmp_path / "out", write_text_pairs(tmp_path / "p.jsonl", 4)),
        sections=host.registries.config_sections,
    )
    adapter = resolve_adapter(config.model, host.registries)
    assets = adapter.build_assets(config.model)
    torch.manual_seed(0)
    policy = adapter.build_model(config.model)
    reference = copy.deepcopy(policy)
    with torch.no_grad():  # a reference that differs from the policy: a non-trivial loss
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    transform = PairTransform(lambda s: adapter.transform(s, assets=assets, max_seq_len=128))
    from hyper_core.data.jsonl import read_jsonl

    pairs = [transform(s) for s in read_jsonl(tmp_path / "p.jsonl")]
    runtime = resolve_runtime(config, adapter, assets, host.registries)
    return pairs, policy, reference, runtime, adapter


def _trl_batch(pairs: list, pad_id: int) -> dict[str, torch.Tensor]:
    """TRL's collated batch: chosen rows then rejected rows, right-padded; the completion
    mask marks reply tokens (a token ``t`` is a completion token when label ``t-1`` is set)."""
    rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    width = max(f.length for f in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    completion = torch.zeros_like(ids)
    for i, f in enumerate(rows):
        ids[i, : f.length] = f.input_ids
        attention[i, : f.length] = 1
        completion[i, 1 : f.length] = (f.labels[:-1] != IGNORE_INDEX).long()
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def _trl_self(beta: float, ref_model: torch.nn.Module) -> types.SimpleNamespace:
    """What ``DPOTrainer._compute_loss`` reads of its trainer, for one process, sigmoid loss."""
    accelerator = types.SimpleNamespace(
        device=torch.device("cpu"), gather_for_metrics=lambda t: t, gather=lambda t: t
    )
    return types.SimpleNamespace(
        model=types.SimpleNamespace(training=True),
        accelerator=accelerator,
        aux_loss_enabled=False,
        ld_alpha=None,
        precompute_ref_logps=False,
        ref_model=ref_model,
        args=types.SimpleNamespace(gradient_checkpointing_kwargs=None),
        f_divergence_type="reverse_kl",
        loss_types=["sigmoid"],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=0.0,
        use_weighting=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
    )


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_loss_rewards_and_grads_equal_trl(tmp_path: Path, beta: float) -> None:
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    pairs, policy, reference, runtime, adapter = _pairs_and_models(tmp_path)
    theirs = copy.deepcopy(policy)
    their_reference = copy.deepcopy(reference)

    # the plugin: one packed micro-batch of the 4 pairs, logits at the label positions
    mb = keep_label_positions(PairBatching(runtime).collate(pairs)[0])
    model_inputs, loss_inputs = runtime.to_device(mb, torch.device("cpu"))
    kwargs = adapter.forward_kwargs()
    with torch.no_grad():
        ref = sequence_logps(reference(**model_inputs, **kwargs).logits, loss_inputs).logps
    cfg = PreferenceConfig(loss="sigmoid", beta=beta)
    terms = pair_terms(
        cfg, sequence_logps(policy(**model_inputs, **kwargs).logits, loss_inputs), ref
    )
    loss = terms.losses.sum() / len(pairs)
    loss.backward()

    # TRL
    for model in (theirs, their_reference):
        model.config._attn_implementation = "sdpa"  # TRL's padded rows take an attention mask
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    fake = _trl_self(beta, their_reference)
    fake.model = theirs
    their_loss = DPOTrainer._compute_loss(fake, theirs, _trl_batch(pairs, 0), False)
    their_loss.backward()
    metrics = fake._metrics["train"]

    torch.testing.assert_close(loss, their_loss, rtol=1e-5, atol=1e-5)
    assert loss.item() != pytest.approx(0.6931, abs=1e-3)  # the reference matters
    assert terms.chosen_rewards.mean().item() == pytest.approx(
        metrics["rewards/chosen"][0], abs=1e-5
    )
    assert terms.rejected_rewards.mean().item() == pytest.approx(
        metrics["rewards/rejected"][0], abs=1e-5
    )
    margin = (terms.chosen_rewards - terms.rejected_rewards).mean().item()
    assert margin == pytest.approx(metrics["rewards/margins"][0], abs=1e-5)
    accuracy = (terms.chosen_rewards > terms.rejected_rewards).float().mean().item()
    assert accuracy == pytest.approx(metrics["rewards/accuracies"][0])
    mine = dict(policy.named_parameters())
    compared = 0
    for name, p in theirs.named_parameters():
        if p.grad is None:
            continue
        torch.testing.assert_close(mine[name].grad, p.grad, rtol=1e-5, atol=1e-5, msg=name)
        compared += 1
    assert compared == sum(1 for p in policy.parameters() if p.grad is not None) > 0


def _logps(n: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random per-sequence sums (interleaved chosen/rejected), token counts, references."""
    generator = torch.Generator().manual_seed(0)
    logps = -torch.rand(2 * n, generator=generator) * 20 - 0.5
    counts = torch.randint(1, 9, (2 * n,), generator=generator).float()
    reference = logps + torch.randn(2 * n, generator=generator)
    return logps, counts, reference


def _cpo_self(**values: object) -> types.SimpleNamespace:
    accelerator = types.SimpleNamespace(device=torch.device("cpu"))
    return types.SimpleNamespace(accelerator=accelerator, alpha=0.0, **values)


def test_conservative_dpo_and_simpo_equal_trl_cpo_loss() -> None:
    """Label-smoothed DPO is TRL's conservative sigmoid loss on the log-ratios, SimPO TRL's
    ``simpo`` on the mean token log-probs (``CPOTrainer.cpo_loss``)."""
    from trl.experimental.cpo.cpo_trainer import CPOTrainer

    from hyper_preference.loss import SequenceLogps

    logps, counts, reference = _logps()
    policy = SequenceLogps(logps=logps, counts=counts)
    cfg = PreferenceConfig(loss="sigmoid", beta=0.3, label_smoothing=0.2)
    mine = pair_terms(cfg, policy, reference)
    trl = _cpo_self(loss_type="sigmoid", beta=0.3, label_smoothing=0.2)
    losses, chosen, rejected = CPOTrainer.cpo_loss(
        trl, logps[0::2] - reference[0::2], logps[1::2] - reference[1::2]
    )
    torch.testing.assert_close(mine.losses, losses, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mine.chosen_rewards, chosen)
    torch.testing.assert_close(mine.rejected_rewards, rejected)

    cfg = PreferenceConfig(loss="simpo", beta=2.0, simpo_gamma=0.7, label_smoothing=0.1)
    mine = pair_terms(cfg, policy, None)
    trl = _cpo_self(loss_type="simpo", beta=2.0, simpo_gamma=0.7, label_smoothing=0.1)
    average = logps / counts
    losses, chosen, rejected = CPOTrainer.cpo_loss(trl, average[0::2], average[1::2])
    torch.testing.assert_close(mine.losses, losses, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mine.chosen_rewards, chosen)


def test_orpo_equals_trl_odds_ratio_plus_nll() -> None:
    """ORPO per pair: the chosen reply's mean NLL minus TRL's odds-ratio term."""
    from trl.experimental.orpo.orpo_trainer import ORPOTrainer

    from hyper_preference.loss import SequenceLogps

    logps, counts, _ = _logps()
    cfg = PreferenceConfig(loss="orpo", beta=0.25)
    mine = pair_terms(cfg, SequenceLogps(logps=logps, counts=counts), None)
    average = logps / counts
    ratio, chosen, _, _, _ = ORPOTrainer.odds_ratio_loss(
        _cpo_self(beta=0.25), average[0::2], average[1::2]
    )
    torch.testing.assert_close(mine.losses, -average[0::2] - ratio, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(mine.chosen_rewards, chosen)


def test_vl_dpo_with_images_once_equals_trl(tmp_path: Path) -> None:
    """The tiny Qwen2.5-VL on 4 shapes pairs: the plugin's packed pairs with each image encoded
    once give TRL's loss and gradients (TRL: padded rows, each with its own image)."""
    from trl.trainer.dpo_trainer import DPOTrainer
    from trl.trainer.utils import add_fused_lm_head

    from hyper_core.demo.shapes import ShapesOptions
    from hyper_preference.shapes import load_shapes_pairs_format
    from hyper_preference.vision import SharedImages

    host = isolated_host([PLUGIN, "hyper_qwen_vl.plugin"])
    raw = dpo_config(tmp_path / "out", tmp_path / "unused.jsonl")
    raw["model"] = {"adapter": "qwen2_5_vl", "config": "tiny"}
    raw["data"]["max_seq_len"] = 256
    config = load_config_dict(raw, sections=host.registries.config_sections)
    adapter = resolve_adapter(config.model, host.registries)
    assets = adapter.build_assets(config.model)
    torch.manual_seed(0)
    policy = adapter.build_model(config.model)
    reference = copy.deepcopy(policy)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    theirs, their_reference = copy.deepcopy(policy), copy.deepcopy(reference)
    spec = adapter.parallel_plan(policy).vision_encoder
    hook = SharedImages(adapter, spec)
    for model in (policy, reference):
        hook.install(model)
    transform = PairTransform(lambda s: adapter.transform(s, assets=assets, max_seq_len=256))
    options = ShapesOptions(num_samples=4, image_size=56, seed=5)
    pairs = [transform(s) for s in load_shapes_pairs_format(None, options, tmp_path)]
    runtime = resolve_runtime(config, adapter, assets, host.registries)

    mb = keep_label_positions(PairBatching(runtime, spec).collate(pairs)[0])
    model_inputs, loss_inputs = runtime.to_device(mb, torch.device("cpu"))
    kwargs = adapter.forward_kwargs()
    with torch.no_grad():
        ref = sequence_logps(reference(**model_inputs, **kwargs).logits, loss_inputs).logps
    cfg = PreferenceConfig(loss="sigmoid", beta=0.5)
    terms = pair_terms(
        cfg, sequence_logps(policy(**model_inputs, **kwargs).logits, loss_inputs), ref
    )
    loss = terms.losses.sum() / len(pairs)
    loss.backward()
    assert (hook.encoded, hook.received) == (8, 16)  # policy + reference, 4 images each

    batch = _trl_batch(pairs, assets.pad_token_id)
    rows = [p.chosen for p in pairs] + [p.rejected for p in pairs]
    batch["pixel_values"] = torch.cat([f.media["pixel_values"] for f in rows])
    batch["image_grid_thw"] = torch.cat([f.media["image_grid_thw"] for f in rows])
    # The adapter's mRoPE positions, padded: with the model's own (get_rope_index on TRL's
    # padded rows) the loss differs by 2.4e-4 on this batch, a matter of the positions, not of
    # the pair objective (with them, images once or each side's own give the same result).
    width = batch["input_ids"].shape[1]
    positions = torch.zeros(rows[0].position_ids.shape[0], len(rows), width, dtype=torch.long)
    for i, f in enumerate(rows):
        positions[:, i, : f.length] = f.position_ids
    batch["position_ids"] = positions
    for model in (theirs, their_reference):
        model.config._attn_implementation = "sdpa"
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "mean_logits", "is_top1"))
    fake = _trl_self(0.5, their_reference)
    fake.model = theirs
    their_loss = DPOTrainer._compute_loss(fake, theirs, batch, False)
    their_loss.backward()

    torch.testing.assert_close(loss, their_loss, rtol=1e-5, atol=1e-5)
    mine = dict(policy.named_parameters())
    grads = [(n, p.grad) for n, p in theirs.named_parameters() if p.grad is not None]
    assert any("visual" in n for n, _ in grads)
    for name, grad in grads:
        torch.testing.assert_close(mine[name].grad, grad, rtol=1e-4, atol=1e-6, msg=name)
