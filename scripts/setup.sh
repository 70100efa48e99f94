#!/usr/bin/env bash
# Create .venv with the CPU torch build, hyper-train and every in-repo plugin (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch first, pinned: a range would pull a multi-GB CUDA build.
.venv/bin/python -c "import torch" 2>/dev/null || "${pip[@]}" "torch==2.13.0"
pkgs=(-e ".[dev,plot,parquet]")
for d in adapters/* plugins/*; do
  [ -f "$d/pyproject.toml" ] || continue
  case "$d" in
    adapters/qwen-vl) pkgs+=(-e "$d[video]") ;;  # PyAV: the video tests decode files
    plugins/preference) pkgs+=(-e "$d[test]") ;;  # trl: the DPO loss-equivalence tests
    *) pkgs+=(-e "$d") ;;
  esac
done
"${pip[@]}" "${pkgs[@]}"
