"""`math`: symbolic equivalence of the final answer with the reference, by math-verify (any task whose
answers are numbers or LaTeX expressions)."""

from __future__ import annotations

from scalerl.tasks.base import Verifier, final_answer_text, register_verifier


def math_answer(response: str, answer: str, metadata: dict) -> float:
    from math_verify import parse, verify

    # math-verify's own timeouts use signal.alarm, which only works on the main thread; the grader runs
    # verifiers on a worker pool and enforces the per-item timeout itself, so they are turned off here.
    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=None)
    if not gold:
        raise ValueError(f"answer: math-verify could not parse the reference {answer!r}")
    target = parse(final_answer_text(response), parsing_timeout=None)
    return 1.0 if verify(gold, target, timeout_seconds=None) else 0.0


register_verifier(Verifier("math", math_answer, packages=("math_verify",)))
