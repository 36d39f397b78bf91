"""Prompt sets built deterministically from a recipe's task (no downloads).

`arithmetic` is the built-in task of the tiny demo model: integer addition with a mix of operand sizes.
`reasoning_gym/<dataset>` draws procedurally generated prompts from reasoning-gym (graded by its verifiers).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Literal

from scalerl.recipe import TaskConfig

Split = Literal["train", "validation"]


@dataclass(frozen=True)
class TaskPrompt:
    prompt_id: str
    text: str
    answer: str
    task: str
    """Verifier name the reward-grader dispatches on."""
    metadata: dict = field(default_factory=dict)

    @property
    def metadata_json(self) -> str:
        return json.dumps(self.metadata, sort_keys=True)


def arithmetic_prompt(a: int, b: int) -> tuple[str, str]:
    return f"{a}+{b}=", str(a + b)


def _split_seed(cfg: TaskConfig, split: Split) -> int:
    digest = hashlib.sha256(f"{cfg.name}:{cfg.seed}:{split}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def _arithmetic(cfg: TaskConfig, split: Split, n: int) -> list[TaskPrompt]:
    rng = random.Random(_split_seed(cfg, split))
    digits = [int(d) for d in cfg.difficulty]
    weights = list(cfg.difficulty.values())
    # Validation prompts are disjoint from training prompts: a pair is in validation iff its hash says so.
    prompts: list[TaskPrompt] = []
    seen: set[tuple[int, int]] = set()
    while len(prompts) < n:
        d = rng.choices(digits, weights)[0]
        lo = 0 if d == 1 else 10 ** (d - 1)
        a, b = rng.randint(lo, 10**d - 1), rng.randint(0, 10**d - 1)
        in_validation = hashlib.sha256(f"{a}+{b}".encode()).digest()[0] < 26  # ~10 % of pairs
        if (a, b) in seen or in_validation != (split == "validation"):
            continue
        seen.add((a, b))
        text, answer = arithmetic_prompt(a, b)
        prompts.append(TaskPrompt(f"{split}-{len(prompts)}", text, answer, "exact_numeric", {"digits": d}))
    return prompts


def _reasoning_gym(cfg: TaskConfig, split: Split, n: int) -> list[TaskPrompt]:
    import reasoning_gym  # heavy import: only when a recipe asks for it

    dataset_name = cfg.name.split("/", 1)[1]
    data = reasoning_gym.create_dataset(dataset_name, size=n, seed=_split_seed(cfg, split) % (2**31))
    out = []
    for i, entry in enumerate(data):
        meta = {"dataset": dataset_name, "entry": json.loads(json.dumps(entry, default=str))}
        out.append(TaskPrompt(f"{split}-{i}", entry["question"], str(entry["answer"]), cfg.name, meta))
    return out


def build_prompts(cfg: TaskConfig, split: Split) -> list[TaskPrompt]:
    n = cfg.num_train_prompts if split == "train" else cfg.num_validation_prompts
    if cfg.name == "arithmetic":
        return _arithmetic(cfg, split, n)
    if cfg.name.startswith("reasoning_gym/"):
        return _reasoning_gym(cfg, split, n)
    raise ValueError(f"task.name: unknown task {cfg.name!r} (use 'arithmetic' or 'reasoning_gym/<dataset>')")
