"""The `scalerl` command: run the stack locally, submit and watch jobs, forecast, scale generators."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from scalerl_forecaster.cli import forecast_app
from scalerl_stack.client import (DATA_DIR, TERMINAL, forecast_or_none, format_comparison, format_decision, format_status,
                                  request, stack_state)

app = typer.Typer(help="ScaleRL: RL post-training with the ScaleRL recipe, and forecasts of where more compute "
                       "takes a run.", no_args_is_help=True, pretty_exceptions_enable=False)
scale_app = typer.Typer(help="Scale services of a Kubernetes deployment.", no_args_is_help=True)
app.add_typer(scale_app, name="scale")
app.add_typer(forecast_app, name="forecast", help="Fit compute→performance curves and decide.")

@app.command()
def serve(service: Annotated[str, typer.Argument(help="api, generator, reward-grader, replay-buffer, learner, "
                                                      "forecaster or weight-broadcast")]) -> None:
    """Run one service in this process (what `scalerl up` runs; images run `scalerl-serve NAME`)."""
    from scalerl.entrypoint import serve as serve_service

    raise typer.Exit(serve_service(service))


@app.command()
def up(generators: Annotated[int, typer.Option(min=1, help="Rollout generator replicas")] = 1,
       detach: Annotated[bool, typer.Option(help="Return once every service is SERVING")] = False,
       timeout: Annotated[float, typer.Option(help="Seconds to wait for SERVING")] = 300.0,
       free_ports: Annotated[bool, typer.Option(help="Unused ports, chosen at start and listed in stack.json (where "
                                                     "`scalerl` finds the api), instead of the defaults: REST 8000 "
                                                     "(unless SCALERL_HTTP_PORT), gRPC 18050-18057, metrics "
                                                     "9100-9107, and on for more generators")] = False) -> None:
    """Run every service on localhost under a supervisor (embedded Valkey unless REDIS_URL is set)."""
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    lock = _lock_stack()  # held by the supervisor for its lifetime
    if detach:
        lock.close()  # free for the supervisor started below
        log_file = open(DATA_DIR / "supervisor.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "scalerl_stack", "up", "--generators", str(generators),
                                 "--timeout", str(timeout), *(["--free-ports"] if free_ports else [])],
                                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                log_file.close()
                tail = (DATA_DIR / "supervisor.log").read_text(errors="replace").splitlines()[-3:]
                typer.echo("\n".join([f"error: supervisor exited ({proc.returncode}); see "
                                       f"{DATA_DIR / 'supervisor.log'}:", *tail]), err=True)
                raise typer.Exit(1)
            state = stack_state()
            # a stack.json left by a supervisor that was killed says "serving" too: only ours counts
            if state and state.get("serving") and state.get("supervisor_pid") == proc.pid:
                _print_stack(state)
                return
            time.sleep(1)
        typer.echo("error: services did not become SERVING in time; see var/logs/", err=True)
        raise typer.Exit(1)

    import logging

    from scalerl.logs import setup_logging
    from scalerl_stack.supervisor import PortsInUse, Stack

    setup_logging("supervisor", "INFO", as_json=False)
    stack = Stack(DATA_DIR, generators=generators, redis_url=os.environ.get("REDIS_URL") or None,
                  free_ports=free_ports)
    stop = [False]

    def on_signal(signum, _frame):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stack.start()
    except PortsInUse as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    try:
        if not stack.wait_serving(timeout):
            logging.getLogger("scalerl").error("not SERVING in time: %s", stack.health())
            raise typer.Exit(1)
        state = json.loads(stack.state_file.read_text()) | {"serving": True}
        stack.state_file.write_text(json.dumps(state, indent=2))
        _print_stack(state)
        stack.run_forever(stop)
    finally:
        stack.stop()


def _lock_stack():
    """Lock DATA_DIR/stack.lock (exclusive, not waiting) -> the open file that holds it; exits when a running stack
    holds it. The kernel drops the lock when its holder dies, however it dies, so a killed stack never blocks."""
    import fcntl

    lock = open(DATA_DIR / "stack.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        pid = (stack_state() or {}).get("supervisor_pid", "?")
        typer.echo(f"error: a stack is already running from {DATA_DIR} (supervisor pid {pid}); "
                   "`python -m scalerl_stack down` stops it", err=True)
        raise typer.Exit(1) from None
    return lock


def _print_stack(state: dict) -> None:
    typer.echo(f"api        {state['api_url']}  (OpenAPI: {state['api_url']}/docs)")
    typer.echo(f"redis      {state['redis_url']}")
    for s in state["services"]:
        typer.echo(f"{s['name']:<16} gRPC {s['grpc']:<17} metrics {s['metrics']:<32} log {s['log']}")


@app.command()
def down() -> None:
    """Stop the stack started by `scalerl up`."""
    state = stack_state()
    if not state:
        typer.echo("no stack running")
        return
    pid = state["supervisor_pid"]
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        (DATA_DIR / "stack.json").unlink(missing_ok=True)
        typer.echo("stack was not running")
        return
    for _ in range(60):
        if not (DATA_DIR / "stack.json").exists():
            break
        time.sleep(0.5)
    typer.echo("stack stopped")


@app.command()
def health() -> None:
    """grpc_health_probe for every local service: exits 1 unless all are SERVING."""
    from scalerl.serving import check_health

    state = stack_state()
    if not state:
        typer.echo("no stack running", err=True)
        raise typer.Exit(1)
    ok = True
    for s in state["services"]:
        status = check_health(s["grpc"], s["health_service"])
        ok &= status == "SERVING"
        typer.echo(f"{s['name']:<16} {s['grpc']:<17} {status}")
    raise typer.Exit(0 if ok else 1)


@app.command()
def submit(recipe: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="Recipe YAML or JSON")],
           name: Annotated[Optional[str], typer.Option(help="Job name")] = None) -> None:
    """Submit a job; prints its id."""
    import yaml

    data = yaml.safe_load(recipe.read_text()) or {}
    body = {"recipe": data.get("recipe", data)}
    if name or data.get("name"):
        body["name"] = name or data.get("name")
    job = request("POST", "/v1/jobs", json=body)
    typer.echo(job["id"])


@app.command()
def status(job_id: Annotated[Optional[str], typer.Argument(help="Job id (default: all jobs)")] = None,
           watch: Annotated[bool, typer.Option(help="Refresh until the job ends")] = False,
           interval: float = 5.0) -> None:
    """Progress: step, pass rate, compute, current forecast."""
    if job_id is None:
        for job in request("GET", "/v1/jobs")["jobs"]:
            typer.echo(format_status(job, None))
        return
    while True:
        job = request("GET", f"/v1/jobs/{job_id}")
        forecast = forecast_or_none(job_id)
        typer.echo(format_status(job, forecast), nl=True)
        if forecast and forecast.get("decision"):
            typer.echo(format_decision(forecast["decision"]))
        if not watch or job["state"] in TERMINAL:
            if job["state"] == "failed":
                typer.echo(f"reason: {job['reason']}", err=True)
            return
        time.sleep(interval)


@app.command()
def compare(job_a: Annotated[str, typer.Argument(help="Job id a")],
            job_b: Annotated[str, typer.Argument(help="Job id b")],
            plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of both curves and bands")] = None,
            level: Annotated[float, typer.Option(min=0.5, max=0.999, help="Level of the verdict")] = 0.95,
            as_json: Annotated[bool, typer.Option("--json", help="Print the REST answer")] = False) -> None:
    """Compare two jobs: A, B, C_mid side by side; ceiling mover, efficiency shaper, both, or no difference."""
    cmp = request("GET", "/v1/compare", params={"jobs": f"{job_a},{job_b}", "level": level})
    typer.echo(json.dumps(cmp) if as_json else format_comparison(cmp))
    if plot is not None:
        from scalerl_forecaster.plot import plot_comparison

        plot_comparison(cmp["jobs"], plot, level=cmp["level"], title=f"{cmp['verdict']} ({cmp['level']:.0%})")
        if not as_json:
            typer.echo(f"plot written to {plot}")


@app.command()
def curve(job_id: str,
          eval_set: Annotated[str, typer.Option("--set", help="iid (validation) or a downstream eval set")] = "iid",
          as_json: Annotated[bool, typer.Option("--json", help="Print the REST answer")] = False) -> None:
    """A job's curve (iid validation or a downstream eval set) and its fit."""
    out = request("GET", f"/v1/jobs/{job_id}/curve", params={"set": eval_set})
    forecast = request("GET", f"/v1/jobs/{job_id}/forecast", params={"set": eval_set})
    if as_json:
        typer.echo(json.dumps({"curve": out, "forecast": forecast}))
        return
    typer.echo(f"{job_id} eval set {out['eval_set']} (sets: {', '.join(out['eval_sets'])})")
    for p in out["points"]:
        typer.echo(f"  v{p['policy_version']:<6} compute {p['compute']:.5g}  pass {p['value']:.3f}")
    if forecast.get("model"):
        fp, iv = forecast["params"], forecast["intervals"]
        typer.echo("  fit " + "  ".join(f"{k}={fp[k]:.4g} [{iv[k][0]:.4g}, {iv[k][1]:.4g}]"
                                        for k in ("A", "B", "C_mid") if k in iv))


@app.command()
def correlations(job_id: str) -> None:
    """Does each downstream eval set track iid validation? Spearman's rho over versions, with an interval."""
    out = request("GET", f"/v1/jobs/{job_id}/correlations")
    if not out["sets"]:
        typer.echo("no downstream eval set has points yet")
    for s in out["sets"]:
        typer.echo(f"{s['eval_set']:<24} {s['num_versions']:>4} versions  {s['note']}")


@app.command()
def decide(job_id: str,
           target: Annotated[Optional[float], typer.Option(min=0.0, max=1.0, help="Pass rate to reach "
                                                                                 "(default: the recipe's)")] = None
           ) -> None:
    """Scale or stop: predictions at 2x, 4x, 10x the compute spent and one recommendation."""
    params = {"target": target} if target is not None else {}
    typer.echo(format_decision(request("GET", f"/v1/jobs/{job_id}/decision", params=params)))


@app.command()
def cancel(job_id: str) -> None:
    """Cancel a queued or running job."""
    job = request("POST", f"/v1/jobs/{job_id}/cancel")
    typer.echo(f"{job['id']} {job['state']}")


@scale_app.command("generators")
def scale_generators(replicas: Annotated[int, typer.Argument(min=0)]) -> None:
    """Set the generator Deployment's replicas (refused outside the configured min/max)."""
    out = request("POST", "/v1/admin/generators/scale", json={"replicas": replicas})
    typer.echo(f"{out['deployment']} scaled to {out['replicas']} replicas")


@app.command()
def demo(recipe: Annotated[Path, typer.Option(help="Recipe of the demo job")] = Path("recipes/demo.yaml"),
         plot: Annotated[Path, typer.Option(help="Where to write the forecast plot")] = Path("var/demo_forecast.png"),
         keep_up: Annotated[bool, typer.Option(help="Leave the stack running afterwards")] = False,
         free_ports: Annotated[bool, typer.Option(help="Start the stack with `scalerl up --free-ports`")] = False,
         ) -> None:
    """The main job end to end: start the stack, submit, watch, print and plot the forecast."""
    from scalerl_stack.demo import run_demo

    raise typer.Exit(run_demo(recipe, plot, keep_up, free_ports))


if __name__ == "__main__":
    app()
