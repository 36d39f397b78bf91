"""PNG plot of a fit: points, fitted curve, extrapolation band, fit window."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .fit import FitResult

__all__ = ["plot_fit", "plot_comparison"]


def plot_fit(result: FitResult, out: str | Path, *, extend_to: float | None = None, title: str | None = None,
             x_unit: str = "device-hours") -> Path:
    """Write the PNG; compute on the x axis is in ``x_unit`` (device-hours: GPU-hours on GPUs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    c, v = result.data if result.data is not None else (np.array([]), np.array([]))
    lo_w, hi_w = result.fit_window
    cmax = max([float(c.max()) if c.size else hi_w, hi_w] + [p.compute for p in result.predictions])
    if extend_to is not None:
        cmax = max(cmax, extend_to)
    cmax *= 1.15
    cpos = c[c > 0]
    cmin = float(cpos.min()) if cpos.size else lo_w / 2
    grid = np.geomspace(max(cmin * 0.8, 1e-300), cmax, 300)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    inwin = (c >= lo_w) & (c <= hi_w)
    ax.scatter(c[inwin & (c > 0)], v[inwin & (c > 0)], s=12, color="C0", label="fitted points", zorder=3)
    ax.scatter(c[~inwin & (c > 0)], v[~inwin & (c > 0)], s=12, facecolors="none", edgecolors="C7",
               label="not fitted", zorder=3)
    ax.axvspan(lo_w, hi_w, color="C0", alpha=0.07, label="fit window")
    y = result.predict(grid)
    lo, hi = result.predict_interval(grid)
    ax.plot(grid, y, color="C3", lw=1.6, label=f"{result.model} fit")
    ax.fill_between(grid, lo, hi, color="C3", alpha=0.18,
                    label=f"{result.level:.0%} band" if result.model != "paper" else "±0.02 A band")
    if result.model != "power":
        ax.axhline(result.params["A"], color="C2", ls="--", lw=1, label=f"A = {result.params['A']:.3f}")
    for p in result.predictions:
        ax.errorbar([p.compute], [p.value], yerr=[[p.value - p.interval[0]], [p.interval[1] - p.value]],
                    fmt="D", color="C1", ms=5, capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel(f"compute ({x_unit})")
    ax.set_ylabel("validation pass rate")
    p = result.params
    third = f"C_mid={p['C_mid']:.4g}" if "C_mid" in p else f"D={p['D']:.3g}"
    ax.set_title(title or f"{result.model}: A={p['A']:.3f} B={p['B']:.2f} {third}"
                 + ("" if result.identifiable else "  (not identifiable)"))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_comparison(jobs: list[dict], out: str | Path, *, title: str = "", level: float = 0.95,
                    x_unit: str = "device-hours") -> Path:
    """PNG of two (or more) jobs on one compute axis: each job's points, fitted curve, band and ceiling A.

    ``jobs`` are the REST comparison's entries: ``job_id``, ``name``, ``points`` [(compute, value)], ``params``
    and ``band`` {compute, fit, lower, upper}.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    for i, job in enumerate(jobs):
        color = f"C{i}"
        label = job.get("name") or job["job_id"]
        pts = np.asarray(job["points"], dtype=float).reshape(-1, 2)
        ax.scatter(pts[:, 0], pts[:, 1], s=10, color=color, alpha=0.7, label=f"{label}: points", zorder=3)
        band = job["band"]
        ax.plot(band["compute"], band["fit"], color=color, lw=1.6, label=f"{label}: fit")
        ax.fill_between(band["compute"], band["lower"], band["upper"], color=color, alpha=0.18,
                        label=f"{label}: {level:.0%} band")
        ax.axhline(job["params"]["A"], color=color, ls="--", lw=1, label=f"{label}: A = {job['params']['A']:.3f}")
    ax.set_xlabel(f"compute ({x_unit})")
    ax.set_ylabel("validation pass rate")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
