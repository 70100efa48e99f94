#!/usr/bin/env bash
# GPU benchmark for an accelerator machine. Prints one JSON line per case: tokens/s, MFU (text +
# vision FLOPs, attention included, over the device's peak for the compute dtype), HFU
# (recomputation included), peak memory, loss. Each case has a `timeout`.
#
#   bash bench/gpu.sh matrix     # issue #31's levers one after the other under an 8-minute
#                                # deadline (bench/gpu_matrix.py): baseline, flash_varlen,
#                                # fsdp2 bf16 compute, the estimate's recompute policy, compile,
#                                # liger-kernel (when installed), then 7B and MoE; writes
#                                # bench/results/gpu/<device>_<date>.json and prints the
#                                # table. Extra arguments go to the module.
#   bash bench/gpu.sh [dense]    # the published Qwen2.5-VL-3B shape, random weights
#                                # (bench/configs/qwen2_5_vl_3b_gpu.toml): packed ~8k-token
#                                # micro-batches (28 samples of ~290 tokens), fp32 master weights
#                                # with bf16 compute (fsdp2 on a 1-rank mesh), flash_varlen
#   bash bench/gpu.sh moe        # a Qwen3-VL-30B-A3B-shaped model cut to 8 layers (128
#                                # experts, top 8), 28 samples (~8k tokens) per GPU and step, on
#                                # NPROC GPUs (default 1), expert parallel over all of them
#   bash bench/gpu.sh test       # the `gpu`-marked tests (pytest -m gpu)
#   bash bench/gpu.sh profile    # the dense case for 6 steps, torch.profiler over steps 4-6:
#                                # prints the op table (self CUDA time); the trace stays in
#                                # RUN_DIR/profile/profile/trace-rank0.json
#   bash bench/gpu.sh all        # test, dense, moe; a failing one does not stop the next
#
# Environment: PYTHON, a python with a CUDA build of torch (default python3); WHEELS, a folder
# of wheels for an offline machine (installed with --no-deps: bring every missing package);
# RUN_DIR, where runs write (default: a temporary folder); ATTN, the attention implementation
# (default flash_varlen); STEPS (default 30); TIMEOUT_S, each case's limit (default 600).
#
# It refuses to run (exit 2) without a CUDA device, never installs torch (a build that does not
# match the driver would fall back to CPU or fail late), and writes no final checkpoint.
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

# A venv that sees $PY's packages (its torch) behind its own: a .pth file, not
# --system-site-packages, because $PY may itself be a venv (whose packages that flag skips).
venv=.venv-gpu
if [ ! -x $venv/bin/python ]; then
  "$PY" -m venv --without-pip $venv  # pip too comes from $PY's packages
  parent=$("$PY" -c "import site; print('\n'.join(site.getsitepackages()))")
  site=$($venv/bin/python -c "import site; print(site.getsitepackages()[0])")
  echo "$parent" > "$site/_gpu_sh_parent.pth"
  pip=($venv/bin/python -m pip install -q --disable-pip-version-check)
  pkgs=(-e .)
  for d in adapters/* plugins/*; do [ -f "$d/pyproject.toml" ] && pkgs+=(-e "$d"); done
  if [ -n "${WHEELS:-}" ]; then
    # --ignore-installed: the wheels win over older copies in $PY's environment.
    "${pip[@]}" --no-index --no-deps --ignore-installed "$WHEELS"/*.whl
    "${pip[@]}" --no-index --no-deps --no-build-isolation "${pkgs[@]}"
  else
    "${pip[@]}" "${pkgs[@]}"
  fi
fi
$venv/bin/python - "$device" <<'PY' >&2
import sys, torch, transformers
assert torch.cuda.is_available(), "the venv lost CUDA torch"
print(f"gpu.sh: {sys.argv[1]}, torch {torch.__version__}, transformers {transformers.__version__}")
PY

run_dense() {
  local out=$1; shift
  timeout "${TIMEOUT_S:-600}" $venv/bin/hyper-train run bench/configs/qwen2_5_vl_3b_gpu.toml \
    --run.output_dir="$out" "--model.attn_implementation=${ATTN:-flash_varlen}" \
    "--training.steps=${STEPS:-30}" --logging.every_steps=10 "$@"
}

run_profile() {  # where the dense step's time goes
  run_dense "$1" --training.steps=6 --logging.every_steps=1 "--logging.profile_steps=[4,6]" \
    && head -60 "$1/profile/ops-rank0.txt"
}

run_moe() {
  local out=$1 nproc=${NPROC:-1}
  local moe='{text_config = {hidden_size = 2048, intermediate_size = 6144, moe_intermediate_size = 768, num_hidden_layers = 8, num_attention_heads = 32, num_key_value_heads = 4, head_dim = 128, num_experts = 128, num_experts_per_tok = 8, vocab_size = 151936}, vision_config = {hidden_size = 1152, intermediate_size = 4304, depth = 4, num_heads = 16, out_hidden_size = 2048}}'
  timeout "${TIMEOUT_S:-600}" $venv/bin/hyper-train run bench/configs/qwen2_5_vl_3b_gpu.toml \
    --nproc-per-node "$nproc" --run.output_dir="$out" --model.adapter=qwen3_vl_moe \
    "--model.hf_overrides=$moe" "--model.attn_implementation=${ATTN:-flash_varlen}" \
    "--parallel.ep=$nproc" "--training.steps=${STEPS:-30}" \
    "--training.global_batch_size=$((28 * nproc))" --logging.every_steps=10
}

report() {  # one JSON line from a run's metrics.jsonl
  $venv/bin/python - "$1" "$2" "$device" "${ATTN:-flash_varlen}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
keys = ("step", "tokens_per_s", "mfu", "hfu", "step_time_s", "data_wait_frac", "mem_peak_mib", "loss",
        "grad_norm", "moe/ep_load_max", "moe/a2a_rows_per_step")
last = rows[-1]
print(json.dumps({"case": sys.argv[2], "device": sys.argv[3], "attn": sys.argv[4],
                  **{k: last[k] for k in keys if k in last},
                  "losses": [round(r["loss"], 4) for r in rows]}))
PY
}

root=${RUN_DIR:-$(mktemp -d)}
status=0
for case in $([ "${1:-dense}" = all ] && echo "test dense moe" || echo "${1:-dense}"); do
  case $case in
    test) mapfile -t files < <(grep -rl "pytest.mark.gpu" tests)
      timeout "${TIMEOUT_S:-600}" $venv/bin/python -m pytest -q -m gpu -p no:cacheprovider "${files[@]}" || status=1 ;;
    dense|moe)
      mkdir -p "$root/$case"
      if "run_$case" "$root/$case"; then report "$root/$case" "$case"; else status=1; fi ;;
    profile) mkdir -p "$root/profile"; run_profile "$root/profile" || status=1 ;;
    matrix) $venv/bin/python -m bench.gpu_matrix "${@:2}" || status=1 ;;
    *) echo "gpu.sh: unknown case '$case' (matrix, dense, moe, test, profile, all)" >&2; exit 2 ;;
  esac
done
exit $status
