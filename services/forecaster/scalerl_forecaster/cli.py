"""``scalerl forecast`` commands: fit a curve CSV, compare two curves.

Only typer and the standard library are imported at module level; numpy/scipy/matplotlib load inside
the commands.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

forecast_app = typer.Typer(
    help="Fit ScaleRL compute->performance curves (sigmoid, power law, paper A.5) and forecast.",
    no_args_is_help=True,
    add_completion=False,
)

DEFAULT_MIN_COMPUTE = 1500.0  # GPU-hours: the paper drops points before ~one epoch


def _fail(msg: str) -> None:
    typer.echo(f"error: {msg}", err=True)
    raise typer.Exit(code=2)


def _load_and_fit(path: Path, **kw):
    from .csvio import read_curve
    from .fit import CurveError, fit_curve

    try:
        c, v = read_curve(path)
        return fit_curve(c, v, **kw)
    except CurveError as e:
        _fail(str(e))


def _fmt_iv(iv) -> str:
    return f"[{iv[0]:.4g}, {iv[1]:.4g}]"


def _summary(res, source: str) -> str:
    p = res.params
    lines = [f"{source}: {res.model} fit on {res.n_points} points, compute {res.fit_window[0]:.4g}..{res.fit_window[1]:.4g}"]
    if res.model == "power":
        lines.append("  R = A - D / C^B")
    else:
        lines.append("  R = R0 + (A - R0) / (1 + (C_mid / C)^B)")
    lvl = f"{res.level:.0%}" if res.model != "paper" else "±0.02"
    for k in p:
        iv = res.intervals.get(k)
        lines.append(f"  {k:<6}= {p[k]:.4g}" + (f"   {lvl} {_fmt_iv(iv)}" if iv is not None else ""))
    for pr in res.predictions:
        lines.append(f"  predicted at {pr.compute:.4g}: {pr.value:.4f}   {lvl} {_fmt_iv(pr.interval)}")
    lines.append(f"  residual sd {res.sigma:.4f}; identifiable: {'yes' if res.identifiable else 'NO'}")
    for w in res.warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


@forecast_app.command("fit")
def fit_cmd(
    curve: Path = typer.Argument(..., help="CSV with header 'compute,value', first row at compute 0"),
    min_compute: float = typer.Option(DEFAULT_MIN_COMPUTE, "--min-compute", help="drop points below this compute from the fit (R0 still comes from compute 0)"),
    fit_until: Optional[float] = typer.Option(None, "--fit-until", help="fit only points up to this compute"),
    predict_at: List[float] = typer.Option([], "--predict-at", help="compute at which to predict (repeatable)"),
    model: str = typer.Option("sigmoid", "--model", help="sigmoid | power | paper"),
    level: float = typer.Option(0.8, "--level", help="interval level"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG of the fit"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed"),
) -> None:
    """Fit one curve and forecast."""
    if model not in ("sigmoid", "power", "paper"):
        _fail(f"unknown model {model!r}; choose sigmoid, power or paper")
    res = _load_and_fit(curve, model=model, min_compute=min_compute, fit_until=fit_until,
                        level=level, predict_at=predict_at, seed=seed)
    if plot is not None:
        from .plot import plot_fit

        plot_fit(res, plot)
    if as_json:
        typer.echo(json.dumps(res.to_json_dict()))
    else:
        typer.echo(_summary(res, str(curve)))
        if plot is not None:
            typer.echo(f"  plot written to {plot}")


@forecast_app.command("compare")
def compare_cmd(
    curve_a: Path = typer.Argument(..., help="first curve CSV (a)"),
    curve_b: Path = typer.Argument(..., help="second curve CSV (b)"),
    min_compute: float = typer.Option(DEFAULT_MIN_COMPUTE, "--min-compute"),
    fit_until: Optional[float] = typer.Option(None, "--fit-until"),
    level: float = typer.Option(0.95, "--level", help="level at which a difference counts as beyond noise"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Compare two curves: ceiling movers (A) vs efficiency shapers (B, C_mid)."""
    from .decisions import compare

    kw = dict(model="sigmoid", min_compute=min_compute, fit_until=fit_until, level=level)
    ra = _load_and_fit(curve_a, seed=0, **kw)
    rb = _load_and_fit(curve_b, seed=1, **kw)
    cmp = compare(ra, rb, level=level)
    if as_json:
        def pd(d):
            return {"a": d.a, "b": d.b, "diff": d.diff, "interval": list(d.interval), "significant": d.significant}

        typer.echo(json.dumps({
            "a": ra.to_json_dict(), "b": rb.to_json_dict(),
            "A": pd(cmp.A), "B": pd(cmp.B), "C_mid_log_ratio": pd(cmp.C_mid),
            "higher_ceiling": cmp.higher_ceiling, "more_efficient": cmp.more_efficient,
            "verdict": cmp.verdict, "notes": cmp.notes,
        }))
        return
    typer.echo(f"a = {curve_a}\nb = {curve_b}")
    typer.echo(cmp.summary)
    for n in cmp.notes + [f"a: {w}" for w in ra.warnings] + [f"b: {w}" for w in rb.warnings]:
        typer.echo(f"note: {n}")
