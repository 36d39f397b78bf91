"""The operator's `scalerl` command, run as a user runs it (a real process, the installed console scripts)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys

from scalerl.ports import bindable
from scalerl.settings import DEFAULT_HTTP_PORT, DEFAULT_PORTS
from scalerl_stack.client import format_status


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerl_stack", *args], capture_output=True, text=True, timeout=120)


def test_help_lists_every_command():
    out = run("--help")
    assert out.returncode == 0, out.stderr
    for command in ("serve", "up", "down", "health", "submit", "status", "cancel", "scale", "forecast", "demo"):
        assert command in out.stdout


def test_serve_refuses_a_service_that_is_not_installed():
    out = run("serve", "nope")
    assert out.returncode == 2
    assert "unknown service 'nope'" in out.stderr and "reward-grader" in out.stderr  # names what is installed


def test_scalerl_serve_without_a_name_prints_usage():
    out = subprocess.run([sys.executable, "-m", "scalerl"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage: scalerl-serve SERVICE" in out.stderr


def test_status_line_shows_progress_and_fit():
    job = {"id": "j1", "state": "running", "step": 50, "policy_version": 50, "last_pass_rate": 0.4321,
           "recipe": {"budget": {"max_steps": 200}}, "compute": {"total_device_hours": 0.0123}}
    forecast = {"model": "sigmoid", "params": {"A": 0.71, "B": 1.5, "C_mid": 0.02}, "identifiable": False}
    line = format_status(job, forecast)
    assert "step 50/200" in line and "pass 0.432" in line and "compute 0.0123 dev-h" in line
    assert "A=0.710" in line and "(not identifiable yet)" in line
    assert line.count("█") == 8  # a quarter of the 30-cell bar


def test_status_line_counts_learner_and_rollout_compute_with_the_evaluator_apart():
    job = {"id": "j1", "state": "running", "step": 5, "policy_version": 5, "last_pass_rate": None,
           "recipe": {"budget": {"compute_device_hours": 0.8}},
           "compute": {"total_device_hours": 0.45, "learner_device_hours": 0.1, "generator_device_hours": 0.3,
                       "evaluator_device_hours": 0.05}}
    line = format_status(job, None)
    assert "compute 0.4000/0.8 dev-h (+0.0500 eval)" in line
    assert line.count("█") == 15  # half the compute budget: the evaluator's hours are not spent from it


def test_status_line_bar_follows_whichever_budget_is_nearer():
    """The demo ends on its compute budget with a step budget as a backstop: a bar reading steps alone showed
    14 % done a third of the way through."""
    job = {"id": "j1", "state": "running", "step": 200, "policy_version": 200, "last_pass_rate": 0.6,
           "recipe": {"budget": {"max_steps": 1500, "compute_device_hours": 0.2}},
           "compute": {"learner_device_hours": 0.02, "generator_device_hours": 0.08}}
    line = format_status(job, None)
    assert "step 200/1500" in line and "compute 0.1000/0.2 dev-h" in line
    assert line.count("█") == 15
    job["step"] = 1200
    assert format_status(job, None).count("█") == 24


def test_a_queued_job_names_only_the_active_jobs_submitted_before_it():
    from scalerl_stack.demo import waiting_behind

    def job(id_, state, created, step=0):
        return {"id": id_, "state": state, "created_at": created, "step": step}

    mine = job("new", "queued", "2026-12-03T10:05:00Z")
    others = [job("old", "running", "2026-12-03T10:00:00Z", step=80), job("done", "succeeded", "2026-12-03T09:00:00Z"),
              job("later", "queued", "2026-12-03T10:06:00Z"), mine]
    note = waiting_behind(mine, others)
    assert note.startswith("waiting behind old (running, step 80):") and "scalerl_stack cancel old" in note
    assert "later" not in note and "done" not in note
    assert waiting_behind(job("new", "running", "2026-12-03T10:05:00Z"), others) is None
    assert waiting_behind(mine, [mine]) is None


def test_the_demo_reports_what_its_forecast_said_at_half_the_compute():
    import numpy as np
    from scalerl_forecaster.fit import halfway_check, sigmoid_curve

    from scalerl_stack.demo import halfway_line

    c = np.linspace(0.0, 0.2, 25)
    v = sigmoid_curve(c, 0.66, 1.4, 0.05, 0.28) + np.random.default_rng(1).normal(0, 0.01, c.size)
    check = halfway_check(c, v)
    line = halfway_line(check)
    assert f"({check.fit.n_points} points up to {check.fit.fit_window[1]:.4g} device-hours" in line
    assert f"pass rate {check.predicted.value:.3f}" in line and f"at {c[-1]:.4g} device-hours" in line
    assert f"the run ended at {np.mean(v[-3:]):.3f}" in line and f"error {check.error:+.3f}" in line
    assert "too few" in halfway_line(halfway_check(c[:6], v[:6]))


def test_the_demo_says_how_far_a_run_without_an_identifiable_ceiling_would_have_to_go():
    from scalerl_stack.demo import identify_line

    line = identify_line({"spent": 0.231, "compute_to_identify": 0.4158, "identifiable": False})
    assert "about 0.416 device-hours in all (1.8x this run)" in line and "budget.compute_device_hours" in line
    assert identify_line({"spent": 0.231, "compute_to_identify": None}) is None
    assert identify_line(None) is None


def _stale_state(data_dir, pid: int) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "stack.json").write_text(json.dumps({
        "supervisor_pid": pid, "redis_url": "redis://127.0.0.1:1/0", "api_url": "http://127.0.0.1:1", "services": [],
        "serving": True}))


def _up_detach(data_dir) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scalerl_stack", "up", "--detach", "--timeout", "5"],
                          capture_output=True, text=True, timeout=120,
                          env=os.environ | {"SCALERL_DATA_DIR": str(data_dir), "REDIS_URL": "redis://127.0.0.1:1/0"})


def test_up_detach_waits_for_its_own_supervisor_not_a_stack_json_a_killed_one_left(tmp_path):
    # a stack killed with SIGKILL leaves stack.json saying "serving"; `make run` then printed that stale state and
    # failed on the api ("connection refused") instead of starting a stack. Here the new supervisor fails before it
    # starts any service (its log folder is a file), so a correct `up --detach` reports that it exited.
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _stale_state(tmp_path, dead.pid)
    (tmp_path / "logs").write_text("not a folder")
    out = _up_detach(tmp_path)
    assert out.returncode == 1, out.stdout
    assert "supervisor exited" in out.stderr and "logs" in out.stderr  # with the end of its log


def test_up_refuses_to_start_a_second_stack_on_the_same_data_dir(tmp_path):
    import fcntl

    _stale_state(tmp_path, 4242)
    with open(tmp_path / "stack.lock", "w") as held:  # what a running supervisor holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = _up_detach(tmp_path)
    assert out.returncode == 1
    assert f"already running from {tmp_path} (supervisor pid 4242)" in out.stderr


def test_up_free_ports_starts_where_every_default_port_is_held(tmp_path):
    """Something on a default port (a node exporter on 9100, say) stops `scalerl up` and `make run`; the error
    names the way out, --free-ports, and with it the stack starts (its port check passes; it then waits for a
    Redis that is not there)."""
    env = {k: v for k, v in os.environ.items() if k != "SCALERL_HTTP_PORT"}
    env |= {"SCALERL_DATA_DIR": str(tmp_path), "REDIS_URL": "redis://127.0.0.1:1/0"}
    up = [sys.executable, "-m", "scalerl_stack", "up", "--timeout", "3"]
    with contextlib.ExitStack() as held:
        for port in {DEFAULT_HTTP_PORT} | {port for pair in DEFAULT_PORTS.values() for port in pair}:
            if bindable(port, reuse_addr=True):  # else someone else holds it already
                held.enter_context(socket.create_server(("127.0.0.1", port)))
        refused = subprocess.run(up, capture_output=True, text=True, timeout=120, env=env)
        started = subprocess.run([*up, "--free-ports"], capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 1 and "already in use" in refused.stderr, refused.stderr
    assert "--free-ports" in refused.stderr
    assert started.returncode == 1 and "already in use" not in started.stderr, started.stderr
    assert "not SERVING in time" in started.stderr, started.stderr


def test_the_cli_finds_the_local_stacks_api_on_the_rest_port_it_was_started_with(tmp_path, monkeypatch):
    """`scalerl up` with SCALERL_HTTP_PORT set (8000 taken) or --free-ports serves REST elsewhere; `scalerl status`
    and the demo went to 8000 regardless."""
    from scalerl_stack import client, demo

    monkeypatch.setattr(client, "DATA_DIR", tmp_path)
    monkeypatch.setenv("SCALERL_API_URL", "")
    assert client.api_endpoint()[0] == "http://127.0.0.1:8000"  # no stack here
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid, url in ((dead.pid, "http://127.0.0.1:8000"), (os.getpid(), "http://127.0.0.1:18123")):
        (tmp_path / "stack.json").write_text(json.dumps({"supervisor_pid": pid, "api_url": "http://127.0.0.1:18123"}))
        assert client.api_endpoint()[0] == url  # a killed stack's stack.json is not believed
    monkeypatch.setenv("SCALERL_API_URL", "https://scalerl.cluster.example/")
    assert client.api_endpoint()[0] == "https://scalerl.cluster.example"  # an explicit URL wins for the CLI
    demo.talk_to_the_local_stack()  # but the demo talks to the stack it started
    assert client.api_endpoint()[0] == "http://127.0.0.1:18123"
