"""The real-model curve's dataset: two-digit sums as a JSONL `file` task ("What is 75 + 72?" -> "147"),
deterministic (random.Random(seed)), so the curve in docs/benchmarks/real_model.md can be rerun.

    python bench/two_digit_sums.py var/datasets/two-digit-sums.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"id": f"sum-{i}", "question": f"What is {a} + {b}?", "answer": str(a + b)})
    return out


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
