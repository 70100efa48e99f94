#!/usr/bin/env bash
# Set up (idempotent), lint, and run the whole test suite (slow multi-process tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} .venv/bin/pytest -q --durations=40 "$@"
