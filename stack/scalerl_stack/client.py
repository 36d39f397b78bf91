"""The api's REST client as the operator's tools use it: requests with the bearer token, one-line job status."""

from __future__ import annotations

import json
import os
from pathlib import Path

import typer

from scalerl.settings import DEFAULT_HTTP_PORT

DATA_DIR = Path(os.environ.get("SCALERL_DATA_DIR", "var"))
TERMINAL = {"succeeded", "failed", "cancelled"}


def stack_state() -> dict | None:
    """What the supervisor of the stack `scalerl up` runs from DATA_DIR wrote: its addresses, api_url included."""
    try:
        return json.loads((DATA_DIR / "stack.json").read_text())
    except (OSError, ValueError):
        return None


def local_api_url() -> str | None:
    """The api of the stack running from DATA_DIR: its REST port may be SCALERL_HTTP_PORT's or, with --free-ports,
    any. None when no supervisor is alive (a killed one leaves its stack.json behind)."""
    state = stack_state() or {}
    try:
        os.kill(int(state["supervisor_pid"]), 0)
    except (KeyError, TypeError, ValueError, ProcessLookupError):
        return None
    except PermissionError:
        pass  # alive, another user's
    return state.get("api_url")


def api_endpoint() -> tuple[str, dict[str, str]]:
    """SCALERL_API_URL; else the local stack's api; else the default REST port on this host."""
    url = (os.environ.get("SCALERL_API_URL") or local_api_url()
           or f"http://127.0.0.1:{DEFAULT_HTTP_PORT}")
    token = os.environ.get("SCALERL_API_TOKEN", "scalerl-dev-token")
    return url.rstrip("/"), {"Authorization": f"Bearer {token}"}


def request(method: str, path: str, **kwargs):
    import httpx

    url, headers = api_endpoint()
    try:
        resp = httpx.request(method, url + path, headers=headers, timeout=30, **kwargs)
    except httpx.HTTPError as err:
        typer.echo(f"error: cannot reach the api at {url}: {err}", err=True)
        raise typer.Exit(1)
    if resp.status_code >= 400:
        typer.echo(f"error: {method} {path} → HTTP {resp.status_code}: {resp.text}", err=True)
        raise typer.Exit(2 if resp.status_code in (401, 404, 409, 422) else 1)
    return resp.json()


def bar(fraction: float, width: int = 30) -> str:
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "█" * filled + "░" * (width - filled)


def format_status(job: dict, forecast: dict | None) -> str:
    budget = job["recipe"]["budget"]
    split = job["compute"]
    # learner + rollout generators, the forecast's x-axis (an older api's total also counted the evaluator)
    compute = (split["learner_device_hours"] + split["generator_device_hours"]
               if "learner_device_hours" in split else split["total_device_hours"])
    # the job ends at whichever budget it reaches first: the bar follows the nearer one
    max_steps, cap = budget.get("max_steps"), budget.get("compute_device_hours")
    frac = max(job["step"] / max_steps if max_steps else 0.0, compute / cap if cap else 0.0)
    of = f"step {job['step']}/{max_steps}" if max_steps else f"step {job['step']}"
    spent = f"{compute:.4f}/{cap:g}" if cap else f"{compute:.4f}"
    rate = "–" if job["last_pass_rate"] is None else f"{job['last_pass_rate']:.3f}"
    evaluator = f" (+{split['evaluator_device_hours']:.4f} eval)" if split.get("evaluator_device_hours") else ""
    line = (f"{job['id']} {job['state']:<9} {bar(frac)} {of}  pass {rate}  compute {spent} dev-h{evaluator}  "
            f"v{job['policy_version']}")
    if forecast and forecast.get("model"):
        p = forecast["params"]
        line += f"  fit A={p['A']:.3f} B={p['B']:.2f} C_mid={p['C_mid']:.3g}"
        if not forecast["identifiable"]:
            line += " (not identifiable yet)"
    return line


def forecast_or_none(job_id: str) -> dict | None:
    import httpx

    url, headers = api_endpoint()
    try:
        resp = httpx.get(f"{url}/v1/jobs/{job_id}/forecast", headers=headers, timeout=10)
        return resp.json() if resp.status_code == 200 else None
    except httpx.HTTPError:
        return None


def format_decision(decision: dict) -> str:
    """The scale-or-stop advice of `GET /v1/jobs/{id}/decision` (or a forecast's `decision`) in a few lines."""
    lines = [f"advice: {decision['recommendation'].upper()}: {decision['reason']}"]
    level = f"{decision['level']:.0%}"
    preds = "  ".join(f"{p['compute'] / decision['spent']:g}x ({p['compute']:.4g}): {p['value']:.3f} "
                      f"[{p['interval'][0]:.3f}, {p['interval'][1]:.3f}]" for p in decision["predictions"])
    lines.append(f"  predicted pass rate ({level}) at the compute spent {decision['spent']:.4g} x  {preds}")
    if decision.get("target") is not None:
        iv = decision.get("compute_to_target_interval")
        span = f" [{iv[0]:.4g}, {'never' if iv[1] is None else format(iv[1], '.4g')}]" if iv else ""
        if decision.get("compute_to_target") is not None:
            lines.append(f"  target {decision['target']:.3f} at compute {decision['compute_to_target']:.4g}{span}")
        else:
            lines.append(f"  target {decision['target']:.3f}: not reachable by the fit"
                         + (f" ({level} interval{span})" if iv else ""))
    if decision.get("compute_to_identify") is not None:
        lines.append(f"  the fit should become identifiable at compute {decision['compute_to_identify']:.4g}")
    return "\n".join(lines)


def format_comparison(cmp: dict) -> str:
    """`GET /v1/compare` as a table of A, B, C_mid with intervals side by side and the verdict."""
    a, b = cmp["jobs"]
    level = f"{cmp['level']:.0%}"
    lines = [f"{'':8}{'a = ' + (a['name'] or a['job_id']):>34}  {'b = ' + (b['name'] or b['job_id']):>34}"]
    for name in ("A", "B", "C_mid"):
        cells = []
        for job in (a, b):
            lo, hi = job["intervals"][name]
            cells.append(f"{job['params'][name]:.4g} {level} [{lo:.4g}, {hi:.4g}]")
        lines.append(f"{name:<8}{cells[0]:>34}  {cells[1]:>34}")
    lines.append(f"verdict at {level}: {cmp['verdict']}")
    if cmp.get("higher_ceiling"):
        lines.append(f"  higher ceiling: {cmp['higher_ceiling']}")
    if cmp.get("more_efficient"):
        lines.append(f"  more efficient: {cmp['more_efficient']}")
    lines += [f"note: {n}" for n in cmp["notes"]] + [f"warning: {w}" for w in cmp["warnings"]]
    return "\n".join(lines)
