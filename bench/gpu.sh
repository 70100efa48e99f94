#!/usr/bin/env bash
# GPU benchmark for an accelerator machine: a Qwen2.5-VL-3B-shaped model (random weights),
# packed ~8k-token micro-batches (28 samples of ~290 tokens), fp32 master weights with bf16
# compute, one GPU. Prints one JSON line: tokens/s, MFU (text + vision FLOPs over the device's
# bf16 dense peak), peak memory, loss. Budget: under 8 minutes.
#
#   bash bench/gpu.sh                  # PYTHON: a python with a CUDA build of torch (default python3)
#   WHEELS=dir bash bench/gpu.sh       # an offline machine: install hyper-train's deps from dir
#   bash bench/gpu.sh moe              # the MoE case: a Qwen3-VL-30B-A3B-shaped text model cut to
#                                      # 8 layers (128 experts, top 8) on NPROC GPUs (default 1),
#                                      # expert parallel over all of them (ep = NPROC) when NPROC > 1
#
# It refuses to run (exit 2) without a CUDA device, never installs torch (a build that does not
# match the driver would fall back to CPU or fail late), and writes no final checkpoint.
# On one rank, `fsdp2` shards nothing, so its param_dtype does not apply: the bf16 compute
# comes from `mixed_precision = "bf16"` (autocast) over the fp32 master weights.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1) || true
  echo "gpu.sh: $PY has no CUDA-enabled torch (driver: ${driver:-none found});" \
    "set PYTHON to a python whose torch build matches the driver" >&2
  exit 2
fi
device=$("$PY" -c "import torch; print(torch.cuda.get_device_name(0))")
echo "gpu.sh: $device, torch $("$PY" -c 'import torch; print(torch.__version__)')" >&2
[ -x .venv-gpu/bin/python ] || "$PY" -m venv --system-site-packages .venv-gpu  # reuse its torch
pip=(.venv-gpu/bin/python -m pip install -q --disable-pip-version-check)
[ -n "${WHEELS:-}" ] && pip+=(--no-index --find-links "$WHEELS")
"${pip[@]}" -e . -e adapters/qwen-vl
.venv-gpu/bin/python -c "import torch; assert torch.cuda.is_available(), 'the venv lost CUDA torch'"
out=$(mktemp -d)
if [ "${1:-dense}" = moe ]; then
  nproc=${NPROC:-1}
  moe='{text_config = {hidden_size = 2048, intermediate_size = 6144, moe_intermediate_size = 768, num_hidden_layers = 8, num_attention_heads = 32, num_key_value_heads = 4, head_dim = 128, num_experts = 128, num_experts_per_tok = 8, vocab_size = 151936}, vision_config = {hidden_size = 1152, intermediate_size = 4304, depth = 4, num_heads = 16, out_hidden_size = 2048}}'
  timeout 900 .venv-gpu/bin/hyper-train run configs/qwen2_5_vl_demo.toml --nproc-per-node "$nproc" \
    --run.output_dir="$out" --model.adapter=qwen3_vl_moe --model.config=tiny --model.dtype=float32 \
    "--model.hf_overrides=$moe" --parallel.strategy=fsdp2 "--parallel.ep=$nproc" \
    --training.mixed_precision=bf16 --training.activation_checkpointing=true \
    --training.steps=30 "--training.global_batch_size=$((8 * nproc))" --training.micro_batch_size=8 \
    --data.train='{format = "shapes", num_samples = 2000, image_size = 448}' --data.num_workers=4 \
    --data.max_seq_len=8192 --logging.every_steps=10 --logging.progress=lines \
    --checkpoint.resume=none --checkpoint.save_final=false
else
# 3B shape: text 2048 x 36 layers (16 heads, 2 KV), MLP 11008; vision 1280 x 32, out 2048.
overrides='{text_config = {hidden_size = 2048, intermediate_size = 11008, num_hidden_layers = 36, num_attention_heads = 16, num_key_value_heads = 2, rope_parameters = {rope_type = "default", rope_theta = 1000000.0, mrope_section = [16, 24, 24]}}, vision_config = {hidden_size = 1280, intermediate_size = 3420, depth = 32, num_heads = 16, out_hidden_size = 2048}}'
timeout 900 .venv-gpu/bin/hyper-train run configs/qwen2_5_vl_demo.toml \
  --run.output_dir="$out" --model.config=tiny --model.dtype=float32 \
  "--model.hf_overrides=$overrides" \
  --parallel.strategy=fsdp2 --parallel.param_dtype=bfloat16 --parallel.reduce_dtype=float32 \
  --training.mixed_precision=bf16 --training.activation_checkpointing=true \
  --training.steps=30 --training.global_batch_size=28 --training.micro_batch_size=28 \
  --data.train='{format = "shapes", num_samples = 1000, image_size = 448}' --data.num_workers=4 \
  --data.max_seq_len=8192 --logging.every_steps=10 --logging.progress=lines \
  --checkpoint.resume=none --checkpoint.save_final=false
fi
.venv-gpu/bin/python - "$out" "$device" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
last = rows[-1]
keys = ("step", "tokens_per_s", "mfu", "mem_peak_mib", "loss", "moe/ep_load_max", "moe/a2a_rows_per_step")
print(json.dumps({"device": sys.argv[2], **{k: last.get(k) for k in keys}}))
PY
