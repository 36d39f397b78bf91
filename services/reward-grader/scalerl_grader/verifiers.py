"""Verifiers behind one interface. A verifier returns a reward in [0, 1] or raises; the service turns a raise or
a timeout into GRADE_STATUS_FAILED (never reward 0)."""

from __future__ import annotations

import json
import re
from typing import Callable, Protocol

_INT = re.compile(r"-?\d+")


class Verifier(Protocol):
    def __call__(self, response: str, answer: str, metadata: dict) -> float: ...


def final_answer_text(response: str) -> str:
    """The part after the reasoning: text after the last </think> if there is one."""
    return response.rsplit("</think>", 1)[-1]


def exact_numeric(response: str, answer: str, metadata: dict) -> float:
    """1 if the last integer of the final answer equals the reference integer."""
    expected = int(answer.strip())
    found = _INT.findall(final_answer_text(response))
    return 1.0 if found and int(found[-1]) == expected else 0.0


def math_answer(response: str, answer: str, metadata: dict) -> float:
    from math_verify import parse, verify

    # math-verify's own timeouts use signal.alarm, which only works on the main thread; the service runs
    # verifiers on a worker pool and enforces the per-item timeout itself, so they are turned off here.
    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=None)
    if not gold:
        raise ValueError(f"answer: math-verify could not parse the reference {answer!r}")
    target = parse(final_answer_text(response), parsing_timeout=None)
    return 1.0 if verify(gold, target, timeout_seconds=None) else 0.0


def reasoning_gym(response: str, answer: str, metadata: dict) -> float:
    import reasoning_gym as rg

    dataset = metadata.get("dataset")
    entry = metadata.get("entry")
    if not dataset or entry is None:
        raise ValueError("metadata_json: reasoning_gym tasks need 'dataset' and 'entry'")
    scorer = rg.get_score_answer_fn(dataset)
    return float(scorer(final_answer_text(response).strip(), entry))


VERIFIERS: dict[str, Callable[[str, str, dict], float]] = {
    "exact_numeric": exact_numeric,
    "math": math_answer,
}


def get_verifier(task: str) -> Callable[[str, str, dict], float]:
    if task in VERIFIERS:
        return VERIFIERS[task]
    if task.startswith("reasoning_gym/"):
        return reasoning_gym
    raise KeyError(f"task: no verifier for {task!r} (known: {sorted(VERIFIERS)} and reasoning_gym/<dataset>)")


def parse_metadata(metadata_json: str) -> dict:
    return json.loads(metadata_json) if metadata_json else {}
