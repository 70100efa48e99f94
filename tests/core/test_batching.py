"""Padded and packed batching: layouts, counts, and loss/gradient equivalence on a real LM."""

from __future__ import annotations

import pytest
import torch

from hyper_core.batching.base import BatchingOptions
from hyper_core.batching.packed import PackedRuntime
from hyper_core.batching.padded import PaddedRuntime
from hyper_core.batching.types import IGNORE_INDEX, SampleFeatures

OPTS = BatchingOptions(micro_batch_size=4, max_seq_len=64, pad_token_id=7)


def feat(n: int, start: int = 10, *, pos3: bool = False, image: bool = False) -> SampleFeatures:
    ids = torch.arange(start, start + n)
    labels = torch.full((n,), IGNORE_INDEX)
    labels[n // 2 : n - 1] = ids[n // 2 + 1 :]
    media = {}
    if image:
        media = {"pixel_values": torch.full((2, 3), float(start)), "grid": torch.tensor([[start]])}
    return SampleFeatures(
        input_ids=ids,
        labels=labels,
        position_ids=torch.stack([torch.arange(n) + k for k in range(3)]) if pos3 else None,
        token_fields={"mm_token_type_ids": torch.ones(n, dtype=torch.int32)},
        media=media,
        num_images=int(image),
        meta={"n": n},
    )


def test_padded_layout() -> None:
    rt = PaddedRuntime(
        BatchingOptions(micro_batch_size=4, max_seq_len=64, pad_token_id=7, pad_to_multiple_of=4)
    )
    a, b = feat(3, 10), feat(5, 20, image=True)
    mb = rt.make_micro_batch([a, b])
    x = mb.model_inputs
    assert x["input_ids"].tolist() == [[10, 11, 12, 7, 7, 7, 7, 7], [20, 21, 22, 23, 24, 7, 7, 7]]
    assert x["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [1] * 5 + [0] * 3]
    assert x["position_ids"].tolist() == [[0, 1, 2, 0, 0, 0, 0, 0], [0, 1, 2, 3, 4, 0, 0, 0]]
    assert x["mm_token_type_ids"].dtype == torch.int32
    assert x["mm_token_type_ids"].tolist()[0] == [1, 1, 1, 0, 0, 0, 0, 0]
    labels = mb.loss_inputs["labels"]
    assert labels[1].tolist() == [-100, -100, 23, 24, -100, -100, -100, -100]
    assert x["pixel_values"].shape == (2, 3) and x["grid"].tolist() == [[20]]
    assert (mb.num_samples, mb.num_tokens, mb.num_padding) == (2, 8, 8)
    assert mb.num_loss_tokens == a.num_loss_tokens + b.num_loss_tokens == 3
    assert (mb.num_images, mb.sample_lengths, mb.meta) == (1, [3, 5], [{"n": 3}, {"n": 5}])
    assert mb.padding_ratio == 0.5


def test_padded_3d_positions_and_media_order() -> None:
    mb = PaddedRuntime(OPTS).make_micro_batch(
        [feat(2, 10, pos3=True, image=True), feat(3, 20, pos3=True, image=True)]
    )
    pos = mb.model_inputs["position_ids"]
    assert pos.shape == (3, 2, 3)
    assert pos[2].tolist() == [[2, 3, 0], [2, 3, 4]]
    assert mb.model_inputs["pixel_values"][:, 0].tolist() == [10, 10, 20, 20]
    assert "pixel_values" not in PaddedRuntime(OPTS).make_micro_batch([feat(2)]).model_inputs
    with pytest.raises(ValueError, match="mix"):
        flat = feat(2)
        flat.position_ids = torch.arange(2)
        PaddedRuntime(OPTS).make_micro_batch([feat(2, pos3=True), flat])


def test_packed_layout() -> None:
    rt = PackedRuntime(OPTS)
    a, b, c = feat(3, 10, image=True), feat(2, 20), feat(4, 30, image=True)
    mb = rt.make_micro_batch([a, b, c])
    x = mb.model_inputs
    assert "attention_mask" not in x
    assert x["input_ids"].tolist() == [[10, 11, 12, 20, 21, 30, 31, 32, 33]]
    assert x["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert mb.loss_inputs["labels"].tolist() == [[-100, 12, -100, -100, -100, -100, -100, 33, -100]]
    assert x["mm_token_type_ids"].shape == (1, 9)
    assert x["pixel_values"][:, 0].tolist() == [10, 10, 30, 30]
    assert (mb.num_tokens, mb.num_padding, mb.num_images, mb.sample_lengths) == (9, 0, 2, [3, 2, 4])

    mb3 = rt.make_micro_batch([feat(2, pos3=True), feat(3, pos3=True)])
    assert mb3.model_inputs["position_ids"].shape == (3, 1, 5)
    assert mb3.model_inputs["position_ids"][1, 0].tolist() == [1, 2, 1, 2, 3]

    padded = PackedRuntime(
        BatchingOptions(micro_batch_size=4, max_seq_len=64, pad_token_id=7, pad_to_multiple_of=8)
    ).make_micro_batch([a, b])
    assert padded.model_inputs["input_ids"].tolist() == [[10, 11, 12, 20, 21, 7, 7, 7]]
    assert padded.model_inputs["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2]]
    assert padded.loss_inputs["labels"][0, 5:].tolist() == [-100] * 3
    assert (padded.num_tokens, padded.num_padding) == (5, 3)


def test_collate_splits_into_micro_batches() -> None:
    rt = PackedRuntime(BatchingOptions(micro_batch_size=2, max_seq_len=64, pad_token_id=0))
    mbs = rt.collate([feat(2), feat(3), feat(4)])
    assert [mb.sample_lengths for mb in mbs] == [[2, 3], [4]]


# -- equivalence on a tiny Qwen2 ----------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM._from_config(cfg, dtype=torch.float32).eval()


def _samples() -> list[SampleFeatures]:
    g = torch.Generator().manual_seed(1)
    out = []
    for n in (5, 11, 3, 8):
        ids = torch.randint(1, 300, (n,), generator=g)
        labels = torch.full((n,), IGNORE_INDEX)
        labels[1 : n - 1] = ids[2:]
        out.append(SampleFeatures(input_ids=ids, labels=labels))
    return out


def _loss_and_grads(model, mb) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    logits = model(**mb.model_inputs, use_cache=False).logits
    labels = mb.loss_inputs["labels"]
    loss = (
        torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        / mb.num_loss_tokens
    )
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return loss.detach(), logits.detach(), grads


def test_packed_equals_padded_loss_and_gradients(model) -> None:
    samples = _samples()
    padded = PaddedRuntime(OPTS).make_micro_batch(samples)
    packed = PackedRuntime(OPTS).make_micro_batch(samples)
    assert padded.num_loss_tokens == packed.num_loss_tokens == sum(n - 2 for n in (5, 11, 3, 8))
    loss_pad, logits_pad, grads_pad = _loss_and_grads(model, padded)
    loss_pack, logits_pack, grads_pack = _loss_and_grads(model, packed)
    torch.testing.assert_close(loss_pack, loss_pad, atol=1e-5, rtol=0)
    assert grads_pad.keys() == grads_pack.keys()
    for name in grads_pad:
        torch.testing.assert_close(grads_pack[name], grads_pad[name], atol=1e-5, rtol=0, msg=name)
    assert any(g.abs().max() > 1e-3 for g in grads_pad.values())
    offset = 0
    for b, f in enumerate(samples):
        segment = logits_pack[0, offset : offset + f.length]
        torch.testing.assert_close(segment, logits_pad[b, : f.length], atol=1e-5, rtol=0)
        offset += f.length

    # packing isolates samples: sample 2 (third) in the packed row == sample 2 alone
    start = 5 + 11
    alone = model(input_ids=samples[2].input_ids[None], use_cache=False).logits[0]
    torch.testing.assert_close(logits_pack[0, start : start + 3], alone.detach(), atol=1e-5, rtol=0)
    # ... and would not be if positions ran on (attention crossing samples changes the logits)
    wrong = model(
        input_ids=packed.model_inputs["input_ids"],
        position_ids=torch.arange(27)[None],
        use_cache=False,
    ).logits[0, start : start + 3]
    assert (wrong - alone).abs().max() > 1e-3
