"""Generate the text SFT demo data (deterministic; see hyper_core/data/text_demo.py).

python configs/data/make_text_demo.py            # writes text_demo.jsonl, text_demo_eval.jsonl
python configs/data/make_text_demo.py --check    # exit 1 if the files are not up to date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hyper_core.demo.text import NUM_EVAL, NUM_TRAIN, SEEDS, render

HERE = Path(__file__).resolve().parent
TRAIN_FILE = HERE / "text_demo.jsonl"
EVAL_FILE = HERE / "text_demo_eval.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify instead of writing")
    parser.add_argument("--out-dir", type=Path, default=HERE)
    args = parser.parse_args(argv)
    files = {
        args.out_dir / TRAIN_FILE.name: render(NUM_TRAIN, SEEDS["train"]),
        args.out_dir / EVAL_FILE.name: render(NUM_EVAL, SEEDS["eval"]),
    }
    stale = [p for p, text in files.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"out of date: {p}", file=sys.stderr)
        return 1 if stale else 0
    for p, text in files.items():
        p.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
