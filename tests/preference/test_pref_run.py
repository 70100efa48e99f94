"""Preference runs on the tiny text model: packed = padded, the reference modes agree, LoRA +
DPO trains, the precomputed reference survives a resume, metrics reach metrics.jsonl."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from pref_helpers import PLUGIN, dpo_config, train, write_text_pairs

from hyper_core.batching.resolve import resolve_runtime
from hyper_core.config import load_config_dict
from hyper_core.errors import RunFailed
from hyper_core.resolve import resolve_adapter
from hyper_core.step.label_positions import keep_label_positions
from hyper_core.testing import isolated_host
from hyper_preference.batching import PairBatching
from hyper_preference.config import PreferenceConfig
from hyper_preference.data import PairTransform
from hyper_preference.loss import pair_terms, sequence_logps
from hyper_preference.reference import PRECOMPUTED_FILE

LN2 = math.log(2)
PEFT = "hyper_peft.plugin"


def _loss_and_grads(tmp_path: Path, batching: str) -> tuple[torch.Tensor, dict[str, Any]]:
    host = isolated_host([PLUGIN])
    raw = dpo_config(tmp_path / batching, write_text_pairs(tmp_path / "p.jsonl", 6))
    raw["data"]["batching"] = batching
    config = load_config_dict(raw, sections=host.registries.config_sections)
    adapter = resolve_adapter(config.model, host.registries)
    assets = adapter.build_assets(config.model)
    torch.manual_seed(0)
    policy = adapter.build_model(config.model)
    reference = copy.deepcopy(policy)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.02 * torch.randn_like(p))
    from hyper_core.data.jsonl import read_jsonl

    transform = PairTransform(lambda s: adapter.transform(s, assets=assets, max_seq_len=128))
    pairs = [transform(s) for s in read_jsonl(tmp_path / "p.jsonl")]
    runtime = resolve_runtime(config, adapter, assets, host.registries)
    cfg = PreferenceConfig(loss="sigmoid", beta=0.5, sft_weight=0.3)
    total = torch.zeros(())
    for mb in PairBatching(runtime).collate(pairs):  # 2 micro-batches of up to 4 pairs
        mb = keep_label_positions(mb)
        model_inputs, loss_inputs = runtime.to_device(mb, torch.device("cpu"))
        with torch.no_grad():
            out = reference(**model_inputs, **adapter.forward_kwargs())
            ref = sequence_logps(out.logits, loss_inputs).logps
        out = policy(**model_inputs, **adapter.forward_kwargs())
        terms = pair_terms(cfg, sequence_logps(out.logits, loss_inputs), ref)
        loss = terms.losses.sum() / len(pairs)
        loss.backward()
        total = total + loss.detach()
    return total, {n: p.grad for n, p in policy.named_parameters() if p.grad is not None}


def test_packed_pairs_equal_padded_pairs(tmp_path: Path) -> None:
    packed, packed_grads = _loss_and_grads(tmp_path, "packed")
    padded, padded_grads = _loss_and_grads(tmp_path, "padded")
    torch.testing.assert_close(packed, padded, rtol=1e-5, atol=1e-6)
    assert packed_grads.keys() == padded_grads.keys() and packed_grads
    for name, grad in packed_grads.items():
        torch.testing.assert_close(grad, padded_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_pairs(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", 48)


def _lora_run(out: Path, pairs: Path, reference: str, steps: int = 3, **sections: Any) -> Any:
    raw = dpo_config(
        out,
        pairs,
        preference={"reference": reference},
        peft={"method": "lora", "r": 8},
        training={"steps": steps, "lr": 1e-2},
        **sections,
    )
    return train(raw, PEFT)


def test_reference_modes_give_the_same_losses(tmp_path: Path, pairs: Path) -> None:
    """LoRA: the base with adapters off, a frozen copy and the precomputed log-probs are one
    reference: the same loss at every step (the first is ln 2, the policy being the
    reference; the later ones are not, so a reference that followed the policy would show)."""
    losses = {
        mode: _lora_run(tmp_path / mode, pairs, mode).losses
        for mode in ("adapters_off", "copy", "precompute")
    }
    first = losses["adapters_off"]
    assert first[0] == pytest.approx(LN2, abs=1e-6)
    assert all(abs(loss - LN2) > 1e-3 for loss in first[1:])
    for mode, values in losses.items():
        assert values == pytest.approx(first, abs=1e-5), mode
    assert (tmp_path / "precompute" / PRECOMPUTED_FILE).is_file()


def test_lora_dpo_trains_and_logs_rewards(tmp_path: Path) -> None:
    """8 pairs, one batch per step: the DPO loss on them falls and the rewards separate, in
    training and on the same pairs as the eval split."""
    few = write_text_pairs(tmp_path / "few.jsonl", 8)
    run = _lora_run(
        tmp_path / "run",
        few,
        "adapters_off",
        steps=8,
        data={"eval": {"format": "preference", "path": str(few)}},
    )
    logged = [m for m in run.metrics if "loss" in m]
    assert logged[0]["rewards/accuracy"] == 0.0  # the policy is the reference: no margin yet
    assert logged[-1]["loss"] < 0.6 * logged[0]["loss"]
    assert logged[-1]["rewards/margin"] > 0 and logged[-1]["rewards/accuracy"] >= 0.875
    (evaluation,) = run.eval_metrics
    assert evaluation["eval_pairs"] == 8 and evaluation["rewards/accuracy"] >= 0.875
    assert evaluation["eval_loss"] < 0.6 * LN2
    assert {"rewards/chosen", "rewards/rejected", "chosen_accuracy"} <= evaluation.keys()
    # only the adapters were trained (the base is the reference)
    trained = [n for n, p in run.trainer.model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)


def test_precomputed_reference_is_reused_on_resume(tmp_path: Path, pairs: Path) -> None:
    """A resumed run reads the reference log-probs the first part wrote and continues
    bit-identically (constant LR: the first part's schedule ends where the whole run's does
    not); without the file a resumed run stops rather than take the trained weights."""
    training = {"steps": 4, "lr_scheduler": "constant"}
    whole = train(
        dpo_config(
            tmp_path / "whole", pairs, preference={"reference": "precompute"}, training=training
        )
    )
    out = tmp_path / "resumed"
    raw = dpo_config(
        out,
        pairs,
        preference={"reference": "precompute"},
        training={**training, "steps": 2},
        checkpoint={"resume": "auto"},
    )
    train(raw)
    table = out / PRECOMPUTED_FILE
    written = table.stat().st_mtime_ns
    raw["training"]["steps"] = 4
    resumed = train(raw)
    assert table.stat().st_mtime_ns == written  # read, not computed again
    assert resumed.losses[-2:] == whole.losses[-2:]  # steps 3 and 4, bit for bit
    assert abs(whole.losses[-1] - LN2) > 1e-3
    table.unlink()
    raw["training"]["steps"] = 5
    with pytest.raises(RunFailed, match=r"reference_logps\.pt is missing"):
        train(raw)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"preference": {"reference": "adapters_off"}}, r'needs \[peft\] method = "lora"'),
    ],
)
def test_reference_mode_errors_name_the_key(
    tmp_path: Path, pairs: Path, sections: dict[str, Any], message: str
) -> None:
    from hyper_core.errors import ConfigError

    with pytest.raises(ConfigError, match=message) as caught:
        train(dpo_config(tmp_path, pairs, **sections))
    assert "$.preference.reference" in str(caught.value)


def test_preference_options_without_loss_are_rejected(tmp_path: Path, pairs: Path) -> None:
    from hyper_core.errors import ConfigError

    raw = dpo_config(tmp_path, pairs)
    raw["preference"] = {"beta": 0.3}
    with pytest.raises(ConfigError, match=r"\$\.preference\.loss: not set"):
        train(raw)


@pytest.mark.parametrize("loss", ["simpo", "orpo"])
def test_reference_free_objectives_train_without_a_reference(tmp_path: Path, loss: str) -> None:
    few = write_text_pairs(tmp_path / "few.jsonl", 8)
    raw = dpo_config(
        tmp_path / loss,
        few,
        preference={"loss": loss, "beta": 2.0},
        training={"steps": 6, "lr": 3e-3},
    )
    run = train(raw)
    (pref,) = [cb for cb in run.trainer.callbacks if type(cb).__name__ == "PreferenceRun"]
    assert pref.mode is None and pref.reference_model is None  # no reference forward
    logged = [m for m in run.metrics if "loss" in m]
    assert logged[-1]["loss"] < logged[0]["loss"]
    assert logged[-1]["rewards/margin"] > logged[0]["rewards/margin"]
