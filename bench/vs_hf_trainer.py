"""vs HF Trainer: real (non-padding) tokens/s, ``transformers.Trainer`` + padding collator (sdpa)
vs hyper-train with packing and ``varlen`` attention, on the same model, the same multimodal
samples, the same epochs.

The data: the demo's shape images with long-tailed answers (log-normal word counts), so that
padding costs what it costs on real SFT data. Both sides train the ~27M Qwen2.5-VL-shaped model
of ``bench/overhead.py`` from the same initial weights; they alternate, one epoch each.
Needs the ``bench`` extra (accelerate).
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from .overhead import MEDIUM_OVERRIDES, _toml_inline
from .runner import Ratio, Result

REPO = Path(__file__).resolve().parents[1]
WORDS = "red green blue circle square triangle small large light dark left right top the a".split()


def make_data(out: Path, n: int, seed: int = 0) -> Path:
    """JSONL conversations: one shape image, a question, a long-tailed answer."""
    from hyper_core.demo.shapes import ensure_shapes

    shapes = ensure_shapes(num_samples=n, image_size=112, seed=seed, split="train")
    jsonl = Path(shapes)
    rows = [json.loads(x) for x in jsonl.read_text().splitlines()]
    rng = random.Random(seed)
    lines = []
    for row in rows[:n]:
        words = min(400, max(2, int(rng.lognormvariate(3.0, 1.0))))
        answer = " ".join(rng.choice(WORDS) for _ in range(words))
        image = str(jsonl.parent / row["messages"][0]["content"][0]["image"])
        lines.append(
            json.dumps(
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": [
                                {"type": "image", "image": image},
                                {"type": "text", "text": "Describe the image."},
                            ],
                        },
                        {"role": "assistant", "content": answer},
                    ]
                }
            )
        )
    path = out / "sft.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _trainer(data: Path, out: str, micro: int, n: int) -> Any:
    from hyper_core.config import load_config
    from hyper_core.testing import isolated_host
    from hyper_core.trainer.trainer import Trainer

    host = isolated_host(["hyper_qwen_vl.plugin"])
    config = load_config(
        REPO / "configs" / "qwen2_5_vl_demo.toml",
        [
            f"--run.output_dir={out}",
            "--logging.progress=none",
            f"--data.train={json.dumps(str(data))}",
            "--data.max_seq_len=1024",
            f"--training.global_batch_size={micro}",
            f"--training.micro_batch_size={micro}",
            f"--training.steps={n // micro}",
            f"--model.hf_overrides={_toml_inline(MEDIUM_OVERRIDES)}",
            "--data.shuffle=false",
            "--checkpoint.every_steps=1000000",
            # Attention paid per packed sample (the padded HF side runs plain sdpa).
            '--model.attn_implementation="varlen"',
        ],
        host.registries.config_sections,
    )
    config = _without_eval(config)
    trainer = Trainer(config, host)
    trainer.setup()
    return trainer


def _without_eval(config: Any) -> Any:
    import attrs

    return attrs.evolve(config, data=attrs.evolve(config.data, eval=None))


def hyper_train_epoch(trainer: Any, state: dict[str, Any]) -> tuple[float, int]:
    """One epoch through the real trainer loop pieces (packed batches)."""
    loader = trainer.dataloaders.train
    it = iter(loader)
    tokens = 0
    t0 = time.perf_counter()
    for _ in range(loader.steps_per_epoch):
        step = next(it)
        trainer.train_step(step)
        tokens += sum(mb.num_tokens for mb in step.micro_batches)
    return time.perf_counter() - t0, tokens


class PaddingCollator:
    """What HF users write for a VLM: pad ids/labels/mask, concatenate pixels."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, features: list[Any]) -> dict[str, Any]:
        import torch

        longest = max(f.length for f in features)
        ids = torch.full((len(features), longest), self.pad_id, dtype=torch.long)
        labels = torch.full((len(features), longest), -100, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for i, f in enumerate(features):
            ids[i, : f.length] = f.input_ids
            unshifted = torch.full_like(f.labels, -100)
            unshifted[1:] = f.labels[:-1]  # HF models shift labels themselves
            labels[i, : f.length] = unshifted
            mask[i, : f.length] = 1
        batch = {"input_ids": ids, "labels": labels, "attention_mask": mask}
        pix = [f.media["pixel_values"] for f in features if "pixel_values" in f.media]
        if pix:
            batch["pixel_values"] = torch.cat(pix)
            batch["image_grid_thw"] = torch.cat([f.media["image_grid_thw"] for f in features])
        return batch


def hf_trainer_epoch(trainer: Any, features: list[Any], micro: int, out: str) -> tuple[float, int]:
    """One epoch of ``transformers.Trainer`` on the same model object and samples."""
    import torch
    from transformers import Trainer, TrainingArguments

    class ListDataset(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(features)

        def __getitem__(self, i: int) -> Any:
            return features[i]

    args = TrainingArguments(
        output_dir=out,
        per_device_train_batch_size=micro,
        num_train_epochs=1,
        learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_steps=0,
        max_grad_norm=1.0,
        logging_strategy="no",
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
        data_seed=0,
    )
    hf = Trainer(
        model=trainer.unwrapped_model,
        args=args,
        train_dataset=ListDataset(),
        data_collator=PaddingCollator(trainer.assets.pad_token_id),
    )
    model = trainer.unwrapped_model
    ours = model.config._attn_implementation
    model.set_attn_implementation("sdpa")  # transformers' own attention for the padded side
    try:
        t0 = time.perf_counter()
        hf.train()
        seconds = time.perf_counter() - t0
    finally:
        model.set_attn_implementation(ours)
    return seconds, sum(f.length for f in features)


def run(size: str = "full") -> Result:
    """Alternate one epoch of each side, ``repeats`` times."""
    n = 32 if size == "ci" else 256
    repeats = 1 if size == "ci" else 3
    micro = 8
    result = Result(
        "vs_hf_trainer", "real tokens/s: HF Trainer (padded) vs hyper-train (packed, varlen)"
    )
    with tempfile.TemporaryDirectory() as tmp:
        data = make_data(Path(tmp), n)
        trainer = _trainer(data, tmp + "/ours", micro, n)
        features = [trainer.datasets.train[i] for i in range(len(trainer.datasets.train))]
        features = [f for f in features if hasattr(f, "input_ids")]
        lengths = [f.length for f in features]
        padded = sum(
            max(lengths[i : i + micro]) * len(lengths[i : i + micro])
            for i in range(0, len(lengths), micro)
        )
        result.params.update(
            samples=len(features),
            micro_batch=micro,
            padding_fraction_padded=1 - sum(lengths) / padded,
            model_params=sum(p.numel() for p in trainer.model.parameters()),
        )
        state: dict[str, Any] = {}
        for _ in range(repeats):
            seconds, tokens = hf_trainer_epoch(trainer, features, micro, tmp + "/hf")
            result.figure("hf_trainer_real_tokens_per_s", "tokens/s").values.append(
                tokens / seconds
            )
            seconds, tokens = hyper_train_epoch(trainer, state)
            result.figure("hyper_train_real_tokens_per_s", "tokens/s").values.append(
                tokens / seconds
            )
        trainer._teardown()
    result.ratios["speedup"] = Ratio(
        "hyper_train_real_tokens_per_s", "hf_trainer_real_tokens_per_s", ">= 1.9"
    )
    return result
