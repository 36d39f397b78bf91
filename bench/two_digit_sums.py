"""The real-model curve's dataset: two-digit sums as a JSONL `file` task ("What is 75 + 72?" -> "147"),
deterministic (random.Random(seed)), so the curve in docs/benchmarks/real_model.md can be rerun.

    python bench/two_digit_sums.py var/datasets/two-digit-sums.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


PAIRS = [(a, b) for a in range(10, 100) for b in range(10, 100)]


def rows(n: int, seed: int) -> list[dict]:
    """n distinct questions: the validation split is held out by id, so a repeated question would be in both."""
    if not 0 < n <= len(PAIRS):
        raise SystemExit(f"--rows: between 1 and {len(PAIRS)} distinct two-digit sums")
    pairs = random.Random(seed).sample(PAIRS, n)
    return [{"id": f"sum-{i}", "question": f"What is {a} + {b}?", "answer": str(a + b)}
            for i, (a, b) in enumerate(pairs)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows(args.rows, args.seed)))
    print(f"wrote {args.rows} rows to {args.out}")


if __name__ == "__main__":
    main()
