"""`arithmetic`: the built-in task of the tiny demo model -- integer addition with a mix of operand sizes
(`a+b=` -> the plain decimal sum), graded by `exact_numeric`. Needs no package and no download."""

from __future__ import annotations

import hashlib
import random
import re

from scalerl.tasks.base import (Split, Task, TaskPrompt, TaskSettings, Verifier, final_answer_text,
                                register_task, register_verifier, split_seed)

_INT = re.compile(r"-?\d+")
_UNIQUE_TRIES = 32


def arithmetic_prompt(a: int, b: int) -> tuple[str, str]:
    """Prompt text and reference answer: ``"47+85="`` -> ``"132"``.

    The expected response is the plain decimal sum followed by end-of-sequence (the tiny model answers
    ``132</s>``); the `exact_numeric` verifier takes the last integer of the response.
    """
    return f"{a}+{b}=", str(a + b)


def is_validation_pair(a: int, b: int) -> bool:
    """Whether the operand pair (a, b) belongs to the held-out side (~10 % of pairs, fixed by hash)."""
    return hashlib.sha256(f"{a}+{b}".encode()).digest()[0] < 26


def arithmetic_prompts(cfg: TaskSettings, split: Split, n: int, verifier: str) -> list[TaskPrompt]:
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
    rng = random.Random(split_seed(cfg, split))
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
        prompts.append(TaskPrompt(f"{split}-{len(prompts)}", text, answer, verifier, {"digits": d}))
    return prompts


def exact_numeric(response: str, answer: str, metadata: dict) -> float:
    """1 if the last integer of the final answer equals the reference integer."""
    expected = int(answer.strip())
    found = _INT.findall(final_answer_text(response))
    return 1.0 if found and int(found[-1]) == expected else 0.0


register_verifier(Verifier("exact_numeric", exact_numeric))
register_task(Task("arithmetic", arithmetic_prompts, verifiers=("exact_numeric", "math")))
