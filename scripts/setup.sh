#!/usr/bin/env bash
# Create .venv with the CPU torch build, hyper-train and every in-repo plugin (editable).
# Says what it is doing at each step (about a minute in all on a fresh machine).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$SECONDS
step() { echo "setup [$((SECONDS - start))s]: $*"; }
if [ -x .venv/bin/python ]; then
  step "using the existing .venv"
else
  step "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
pip=(.venv/bin/python -m pip install -q --disable-pip-version-check)
# torch first, pinned: a range would pull a multi-GB CUDA build.
if .venv/bin/python -c "import torch" 2>/dev/null; then
  step "torch is installed"
else
  step "installing torch 2.13.0 (CPU build, about 200 MB; the longest step)"
  "${pip[@]}" "torch==2.13.0"
fi
pkgs=(-e ".[dev,plot,parquet]")
names=()
for d in adapters/* plugins/*; do
  [ -f "$d/pyproject.toml" ] || continue
  names+=("${d#*/}")
  case "$d" in
    adapters/qwen-vl) pkgs+=(-e "$d[video]") ;;  # PyAV: the video tests decode files
    plugins/preference) pkgs+=(-e "$d[test]") ;;  # trl: the DPO loss-equivalence tests
    plugins/peft) pkgs+=(-e "$d[qlora]") ;;  # torchao: the QLoRA (NF4) tests
    *) pkgs+=(-e "$d") ;;
  esac
done
step "installing hyper-train and ${#names[@]} in-repo packages (${names[*]}) with their dependencies"
"${pip[@]}" "${pkgs[@]}"
step "done: .venv/bin/hyper-train $(.venv/bin/hyper-train --version | cut -d' ' -f2)"
