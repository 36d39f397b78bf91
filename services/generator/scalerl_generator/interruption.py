"""Forced interruption (docs/scalerl.md §3): the per-completion thinking budget and the merge of version spans."""

from __future__ import annotations

import random

DEFAULT_INTERRUPTION_PHRASE = (
    "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"
)
END_OF_THINKING = "</think>"


def draw_budget(thinking_budget: tuple[int, int], *, seed: int, request_id: str, index: int) -> int:
    """A budget drawn uniformly from [low, high] (both inclusive), reproducible per completion."""
    low, high = thinking_budget
    if not 0 < low <= high:
        raise ValueError(f"thinking_budget must satisfy 0 < low <= high, got {thinking_budget}")
    return random.Random(f"{seed}:{request_id}:{index}").randint(low, high)


def merge_spans(spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Merge adjacent (version, start, end) spans with the same version; drop empty ones."""
    out: list[tuple[int, int, int]] = []
    for v, s, e in spans:
        if e <= s:
            continue
        if out and out[-1][0] == v and out[-1][2] == s:
            out[-1] = (v, out[-1][1], e)
        else:
            out.append((v, s, e))
    return out
