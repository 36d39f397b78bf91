"""Does a downstream eval set track iid validation? Spearman's rank correlation over policy versions, with an
interval, or "too few points"."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

MIN_VERSIONS = 5
"""Fewer shared versions than this: too few points to tell (the Fisher-z interval needs n > 3, and with 4 points
every ordering has probability >= 1/24)."""


@dataclass
class Spearman:
    n: int
    rho: float
    interval: tuple[float, float]
    enough: bool
    note: str


def _ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their ranks)."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x))
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float], level: float = 0.95) -> Spearman:
    """Spearman's rho of paired values with a Fisher-z interval (SE sqrt(1.06 / (n - 3)), Fieller, Hartley and
    Pearson 1957); ``enough`` is False below MIN_VERSIONS pairs, or when one side is constant."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    xa, ya = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xa.shape != ya.shape or xa.ndim != 1:
        raise ValueError("x and y must be 1-D and of the same length")
    n = int(xa.size)
    if n < MIN_VERSIONS:
        return Spearman(n, 0.0, (-1.0, 1.0), False,
                        f"too few points to tell: {n} shared versions, at least {MIN_VERSIONS} needed")
    rx, ry = _ranks(xa), _ranks(ya)
    if np.all(rx == rx[0]) or np.all(ry == ry[0]):
        return Spearman(n, 0.0, (-1.0, 1.0), False, "one of the curves is constant over these versions")
    rho = float(np.corrcoef(rx, ry)[0, 1])
    z = math.atanh(max(min(rho, 1 - 1e-12), -1 + 1e-12))
    half = NormalDist().inv_cdf((1 + level) / 2) * math.sqrt(1.06 / (n - 3))
    lo, hi = math.tanh(z - half), math.tanh(z + half)
    if lo > 0:
        note = f"tracks iid validation: rho {rho:+.2f}, {level:.0%} interval [{lo:+.2f}, {hi:+.2f}] above 0"
    elif hi < 0:
        note = f"moves against iid validation: rho {rho:+.2f}, {level:.0%} interval [{lo:+.2f}, {hi:+.2f}]"
    else:
        note = (f"no correlation beyond noise: rho {rho:+.2f}, {level:.0%} interval [{lo:+.2f}, {hi:+.2f}] "
                "contains 0")
    return Spearman(n, rho, (lo, hi), True, note)
