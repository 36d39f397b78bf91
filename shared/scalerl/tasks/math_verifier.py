"""`math`: symbolic equivalence of the final answer with the reference, by math-verify (any task whose
answers are numbers or LaTeX expressions)."""

from __future__ import annotations

import threading

from scalerl.tasks.base import Verifier, final_answer_text, register_verifier


PARSE_TIMEOUT_S = 5
VERIFY_TIMEOUT_S = 5


def math_answer(response: str, answer: str, metadata: dict) -> float:
    from math_verify import parse, verify

    # math-verify's own timeouts use signal.alarm, which works on the main thread only: the reward-grader runs
    # each verifier on the main thread of a worker process (and kills the process past the item's timeout);
    # called on another thread (in-process use), they are off.
    on_main = threading.current_thread() is threading.main_thread()
    parse_timeout, verify_timeout = (PARSE_TIMEOUT_S, VERIFY_TIMEOUT_S) if on_main else (None, None)
    gold = parse(answer if "$" in answer or "\\boxed" in answer else f"${answer}$", parsing_timeout=parse_timeout)
    if not gold:
        raise ValueError(f"answer: math-verify could not parse the reference {answer!r}")
    target = parse(final_answer_text(response), parsing_timeout=parse_timeout)
    if _is_number(gold) and not _is_number(target):
        # A numeric reference wants the value: math-verify would score an expression that evaluates to it, so a
        # policy learned to restate the question ("16 + 44" for 60) and got full reward (docs/benchmarks/real_model.md).
        return 0.0
    return 1.0 if verify(gold, target, timeout_seconds=verify_timeout) else 0.0


def _is_number(parsed: list) -> bool:
    """math-verify's first parse is a value as written, not an expression that evaluates to it."""
    import sympy

    return bool(parsed) and isinstance(parsed[0], sympy.Basic) and _written_number(parsed[0])


def _written_number(expr) -> bool:
    """A number literal (integer, decimal, fraction, negative, percentage); an equation counts by its right side,
    as math-verify grades it against a reference that is not an equation ("16 + 44 = 60")."""
    import sympy

    if isinstance(expr, sympy.Eq):
        return _written_number(expr.rhs)
    if isinstance(expr, sympy.UnevaluatedExpr):
        return _written_number(expr.args[0])
    if expr.is_Number:
        return True
    if not isinstance(expr, sympy.Mul):
        return False
    # math-verify parses without evaluating: "1/2" is Mul(1, Pow(2, -1)), "50\%" is Mul(50, UnevaluatedExpr(1/100)),
    # "2*30" is Mul(2, 30). One numerator; the other factors divide (or are a sign).
    numerators = 0
    for factor in expr.args:
        if factor == -1:
            continue
        if isinstance(factor, sympy.Pow) and factor.exp == -1 and factor.base.is_Number:
            continue
        if isinstance(factor, sympy.UnevaluatedExpr) and factor.args[0].is_Number:
            continue
        if not factor.is_Number:
            return False
        numerators += 1
    return numerators <= 1


register_verifier(Verifier("math", math_answer, packages=("math_verify", "sympy")))
