"""The api's REST client as the operator's tools use it: requests with the bearer token, one-line job status."""

from __future__ import annotations

import os
from pathlib import Path

import typer

DATA_DIR = Path(os.environ.get("SCALERL_DATA_DIR", "var"))
TERMINAL = {"succeeded", "failed", "cancelled"}


def api_endpoint() -> tuple[str, dict[str, str]]:
    url = os.environ.get("SCALERL_API_URL", "http://127.0.0.1:8000")
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
    if budget.get("max_steps"):
        frac, of = job["step"] / budget["max_steps"], f"step {job['step']}/{budget['max_steps']}"
    else:
        frac, of = compute / budget["compute_device_hours"], f"step {job['step']}"
    rate = "–" if job["last_pass_rate"] is None else f"{job['last_pass_rate']:.3f}"
    evaluator = f" (+{split['evaluator_device_hours']:.4f} eval)" if split.get("evaluator_device_hours") else ""
    line = (f"{job['id']} {job['state']:<9} {bar(frac)} {of}  pass {rate}  compute {compute:.4f} dev-h{evaluator}  "
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
