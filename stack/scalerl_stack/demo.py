"""`make run`: the main job on the embedded default — start the stack, submit the demo recipe, show live
progress, then print the fitted A, B, C_mid and plot the curve with its extrapolation band."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer

from scalerl_stack.client import DATA_DIR, TERMINAL, forecast_or_none, format_status, local_api_url, request


def _scalerl(*args: str) -> int:
    return subprocess.call([sys.executable, "-m", "scalerl_stack", *args])


@contextlib.contextmanager
def stopping_like_ctrl_c():
    """SIGTERM (`kill`, `timeout`, a CI step cancelled) and SIGHUP (its terminal closed) end `make run` as Ctrl-C
    does: the job it follows cancelled and the stack taken down, not the job left for the next `make run` to resume
    while its own job waits behind it."""

    def interrupt(signum, _frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_demo(recipe: Path, plot: Path, keep_up: bool, free_ports: bool = False) -> int:
    with stopping_like_ctrl_c():
        return _run_demo(recipe, plot, keep_up, free_ports)


def _run_demo(recipe: Path, plot: Path, keep_up: bool, free_ports: bool) -> int:
    started = time.monotonic()
    import yaml

    from scalerl.models import resolve_model_path

    data = yaml.safe_load(recipe.read_text())
    model_path = (data.get("recipe", data).get("model") or {}).get("path", "builtin:tiny-arithmetic")
    typer.echo(f"== preparing the model {model_path} (offline; builtins are built or converted once)")
    model_dir = resolve_model_path(model_path, DATA_DIR)
    typer.echo(f"   {model_dir} ({time.monotonic() - started:.0f}s)")
    typer.echo("== starting the stack (every service on localhost, embedded Valkey, SQLite)")
    if _scalerl("up", "--detach", *(["--free-ports"] if free_ports else [])) != 0:
        return 1
    try:
        talk_to_the_local_stack()
        job_id = _submit(recipe)
        typer.echo(f"== job {job_id} submitted; live progress:")
        job = follow(job_id)
        if job is None:
            return 130
        typer.echo(f"== job {job['state']} after {time.monotonic() - started:.0f}s: {job['reason']}")
        return _report(job, plot) if job["state"] == "succeeded" else 1
    finally:
        if not keep_up:
            _scalerl("down")


def talk_to_the_local_stack() -> None:
    """The demo's requests go to the stack it started, not to a SCALERL_API_URL exported for a cluster."""
    if url := local_api_url():
        os.environ["SCALERL_API_URL"] = url


def _submit(recipe: Path) -> str:
    import yaml

    data = yaml.safe_load(recipe.read_text())
    return request("POST", "/v1/jobs", json={"recipe": data.get("recipe", data), "name": data.get("name")})["id"]


def waiting_behind(job: dict, others: list[dict]) -> str | None:
    """What a queued job waits for: the active jobs ahead of it (one job runs at a time), and how to stop one."""
    if job["state"] != "queued":
        return None
    ahead = [j for j in others if j["id"] != job["id"] and j["state"] in ("queued", "running")
             and j["created_at"] <= job["created_at"]]
    if not ahead:
        return None
    names = ", ".join(f"{j['id']} ({j['state']}, step {j['step']})" for j in ahead)
    return (f"waiting behind {names}: one job runs at a time; "
            f"`python -m scalerl_stack cancel {ahead[0]['id']}` stops it")


def follow(job_id: str) -> dict | None:
    """Live progress until the job ends; on Ctrl-C, SIGTERM or SIGHUP the job is cancelled (None). Left running, an
    interrupted demo job would be resumed by the next `make run`, whose own job would wait behind it."""
    try:
        with stopping_like_ctrl_c():
            return _watch(job_id)
    except KeyboardInterrupt:
        try:
            request("POST", f"/v1/jobs/{job_id}/cancel")
            typer.echo(f"\n== interrupted: job {job_id} cancelled")
        except typer.Exit:  # it ended meanwhile (409) or the api is gone: nothing to cancel
            typer.echo(f"\n== interrupted; job {job_id} was not cancelled")
        return None


def _watch(job_id: str) -> dict:
    last, told = "", False
    while True:
        job = request("GET", f"/v1/jobs/{job_id}")
        line = format_status(job, forecast_or_none(job_id))
        if line != last:
            typer.echo("   " + line)
            last = line
        if not told and job["state"] == "queued":
            note = waiting_behind(job, request("GET", "/v1/jobs", params={"limit": 1000})["jobs"])
            if note:
                typer.echo("   " + note)
                told = True
        if job["state"] in TERMINAL:
            return job
        time.sleep(5)


def halfway_line(check) -> str:
    """What the forecast said at half the run's compute against where the run ended: the product's point."""
    if check is None:
        return "== too few validation points in the first half of the compute to check its forecast"
    pred, fit = check.predicted, check.fit
    ceiling = "ceiling identifiable" if fit.identifiable else "ceiling not identifiable yet"
    return (f"== forecast made at half the compute ({fit.n_points} points up to {fit.fit_window[1]:.4g} "
            f"device-hours; {ceiling}): pass rate {pred.value:.3f} [{pred.interval[0]:.3f}, "
            f"{pred.interval[1]:.3f}] at {pred.compute:.4g} device-hours; the run ended at {check.final:.3f} "
            f"(mean of its last points): error {check.error:+.3f}")


def identify_line(decision: dict | None) -> str | None:
    """When the ceiling is not identifiable yet: how far the forecaster expects the run would have to go."""
    needed = (decision or {}).get("compute_to_identify")
    if needed is None:
        return None
    return (f"   the ceiling should become identifiable at about {needed:.3g} device-hours in all "
            f"({needed / decision['spent']:.2g}x this run): raise budget.compute_device_hours to run that far")


def _report(job: dict, plot: Path) -> int:
    from scalerl_forecaster.fit import CurveError, fit_curve, halfway_check
    from scalerl_forecaster.plot import plot_fit

    curve = request("GET", f"/v1/jobs/{job['id']}/curve")["points"]
    forecast = request("GET", f"/v1/jobs/{job['id']}/forecast")
    plot.parent.mkdir(parents=True, exist_ok=True)
    csv_path = plot.with_suffix(".csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["compute", "value"])
        for p in curve:
            writer.writerow([p["compute"], p["value"]])
    typer.echo("== validation curve (compute in device-hours → pass rate):")
    for p in curve:
        typer.echo(f"   step {p['step']:>4}  v{p['policy_version']:>4}  {p['compute']:.5f}  {p['value']:.3f}")
    if not forecast.get("model"):
        typer.echo(f"== no fit: {forecast.get('warnings')}")
        return 1
    params, iv = forecast["params"], forecast["intervals"]
    typer.echo("== live forecast (sigmoid R(C) = R0 + (A−R0)/(1+(C_mid/C)^B), 80% intervals):")
    for name in ("A", "B", "C_mid", "R0"):
        lo_hi = iv.get(name)
        extra = f"  [{lo_hi[0]:.4g}, {lo_hi[1]:.4g}]" if lo_hi else ""
        typer.echo(f"   {name:<6}= {params[name]:.4g}{extra}")
    for p in forecast["predictions"]:
        typer.echo(f"   predicted pass rate at {p['compute']:.4g} device-hours: {p['value']:.3f} "
                   f"[{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]")
    if not forecast["identifiable"]:
        typer.echo(f"   warnings: {forecast['warnings']}")
        if line := identify_line(forecast.get("decision")):
            typer.echo(line)
    compute = [p["compute"] for p in curve]
    values = [p["value"] for p in curve]
    recipe = job["recipe"]
    try:
        typer.echo(halfway_line(halfway_check(compute, values, min_compute=recipe["forecast"]["min_compute"],
                                              level=recipe["forecast"]["level"])))
    except CurveError as exc:
        typer.echo(f"== no forecast at half the compute: {exc}")
    result = fit_curve(compute, values, model="sigmoid", min_compute=recipe["forecast"]["min_compute"],
                       level=recipe["forecast"]["level"], discrepancy=recipe["forecast"]["model_discrepancy"],
                       predict_at=[2 * max(compute)])
    plot_fit(result, plot, extend_to=2 * max(compute), title=f"ScaleRL demo job {job['id']}")
    (plot.with_suffix(".json")).write_text(json.dumps(forecast, indent=2))
    typer.echo(f"== plot: {plot}  curve: {csv_path}")
    return 0
