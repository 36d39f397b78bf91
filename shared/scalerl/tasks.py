"""Prompt sets built deterministically from a recipe's task (no downloads).

`arithmetic` is the built-in task of the tiny demo model: integer addition with a mix of operand sizes
(`a+b=` -> the plain decimal sum).
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
    """Prompt text and reference answer: ``"47+85="`` -> ``"132"``.

    The expected response is the plain decimal sum followed by end-of-sequence (the tiny model answers
    ``132</s>``); the `exact_numeric` verifier takes the last integer of the response.
    """
    return f"{a}+{b}=", str(a + b)


def is_validation_pair(a: int, b: int) -> bool:
    """Whether the operand pair (a, b) belongs to the held-out side (~10 % of pairs, fixed by hash)."""
    return hashlib.sha256(f"{a}+{b}".encode()).digest()[0] < 26


def _split_seed(cfg: TaskConfig, split: Split) -> int:
    digest = hashlib.sha256(f"{cfg.name}:{cfg.seed}:{split}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


_UNIQUE_TRIES = 32


def _arithmetic(cfg: TaskConfig, split: Split, n: int) -> list[TaskPrompt]:
    """`n` addition prompts; each draws its operand size d from `cfg.difficulty` (a: exactly d digits, b: at
    most d digits; d = 1 allows 0..9 for both).

    Train and validation are disjoint by operand pair (`is_validation_pair`). Within a split pairs are unique
    while the size class has unseen pairs left; a class that is (nearly) exhausted -- 1-digit has only ~90
    training pairs -- repeats pairs rather than skewing the difficulty mix.
    """
    for key, weight in cfg.difficulty.items():
        if not key.isdigit() or not 1 <= int(key) <= 9 or weight < 0:
            raise ValueError(
                f"task.difficulty: keys must be digit counts 1..9 with weights >= 0, got {key!r}: {weight}"
            )
    if sum(cfg.difficulty.values()) <= 0:
        raise ValueError("task.difficulty: weights must not all be 0")
    rng = random.Random(_split_seed(cfg, split))
    digits = [int(d) for d in cfg.difficulty]
    weights = list(cfg.difficulty.values())
    want_validation = split == "validation"
    prompts: list[TaskPrompt] = []
    seen: set[tuple[int, int]] = set()
    while len(prompts) < n:
        d = rng.choices(digits, weights)[0]
        lo = 0 if d == 1 else 10 ** (d - 1)
        for _ in range(_UNIQUE_TRIES):
            a, b = rng.randint(lo, 10**d - 1), rng.randint(0, 10**d - 1)
            if is_validation_pair(a, b) == want_validation and (a, b) not in seen:
                break
        else:  # class exhausted: accept a repeat from the right side of the split
            while True:
                a, b = rng.randint(lo, 10**d - 1), rng.randint(0, 10**d - 1)
                if is_validation_pair(a, b) == want_validation:
                    break
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
