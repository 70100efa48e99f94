#!/usr/bin/env bash
# GPU benchmark for an accelerator machine: a Qwen2.5-VL-3B-shaped model (random weights),
# packed ~8k-token micro-batches (28 samples of ~290 tokens), bf16, fsdp2 on one GPU. Prints tokens/s and MFU (text + vision
# FLOPs over the H200 bf16 dense peak). Budget: under 8 minutes including installs.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install -q torch  # the CUDA build
.venv-gpu/bin/pip install -q -e . -e adapters/qwen-vl
out=$(mktemp -d)
# 3B shape: text 2048 x 36 layers (16 heads, 2 KV), MLP 11008; vision 1280 x 32, out 2048.
overrides='{text_config = {hidden_size = 2048, intermediate_size = 11008, num_hidden_layers = 36, num_attention_heads = 16, num_key_value_heads = 2, rope_parameters = {rope_type = "default", rope_theta = 1000000.0, mrope_section = [16, 24, 24]}}, vision_config = {hidden_size = 1280, intermediate_size = 3420, depth = 32, num_heads = 16, out_hidden_size = 2048}}'
.venv-gpu/bin/hyper-train run configs/qwen2_5_vl_demo.toml \
  --run.output_dir="$out" --model.config=tiny --model.dtype=bfloat16 \
  "--model.hf_overrides=$overrides" \
  --parallel.strategy=fsdp2 --parallel.param_dtype=bfloat16 --parallel.reduce_dtype=float32 \
  --training.mixed_precision=bf16 --training.activation_checkpointing=true \
  --training.steps=30 --training.global_batch_size=28 --training.micro_batch_size=28 \
  --data.train='{format = "shapes", num_samples = 1000, image_size = 448}' \
  --data.max_seq_len=8192 --logging.every_steps=10 --logging.progress=lines \
  --checkpoint.resume=none --checkpoint.every_steps=100000
.venv-gpu/bin/python - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
last = rows[-1]
print(json.dumps({k: last.get(k) for k in ("step", "tokens_per_s", "mfu", "mem_peak_mib", "loss")}))
PY
