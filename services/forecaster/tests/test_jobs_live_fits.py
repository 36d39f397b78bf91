"""The live fits run outside the lock that guards the curves: a GPU run's curve of thousands of points takes
seconds to fit, and meanwhile reads, other curves and the points that keep arriving must not queue behind it.

A fit is held at a gate (the real fit, run once the gate opens) to make "meanwhile" happen on every run."""

from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest
from prometheus_client import REGISTRY

from scalerl.v1 import common_pb2
from scalerl_forecaster import jobs, metrics
from scalerl_forecaster.fit import sigmoid_curve
from scalerl_forecaster.store import PointLog

WAIT_S = 10.0


def point(job_id: str, version: int) -> common_pb2.ValidationPoint:
    compute = 2.0 * version
    value = float(sigmoid_curve(np.array([compute]), 0.7, 1.5, 20.0, 0.2)[0])
    return common_pb2.ValidationPoint(job_id=job_id, step=version, policy_version=version, compute=compute,
                                      value=value)


class Interrupted(BaseException):
    """Not a fit error: it passes the fit's own handling, as KeyboardInterrupt or SystemExit would."""


class Gate:
    """Wraps the real fit_curve: a fit called from a gated thread waits until `opened` is set (then raises
    Interrupted when `fail`); every call is counted."""

    def __init__(self, monkeypatch):
        self.real = jobs.fit_curve
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.gated: set[int] = set()
        self.calls = 0
        self.fail = False
        self.count_lock = threading.Lock()
        monkeypatch.setattr(jobs, "fit_curve", self)

    def __call__(self, *args, **kwargs):
        with self.count_lock:
            self.calls += 1
        if threading.get_ident() in self.gated:
            self.entered.set()
            assert self.opened.wait(WAIT_S), "the gate was never opened"
            if self.fail:
                raise Interrupted
        return self.real(*args, **kwargs)

    def run_gated(self, fn, *args) -> tuple[threading.Thread, list]:
        """Run fn(*args) in a thread whose fit waits at the gate; returns once that fit has started."""
        out: list = []

        def target():
            self.gated.add(threading.get_ident())
            try:
                out.append(fn(*args))
            except Interrupted as err:
                out.append(err)

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        assert self.entered.wait(WAIT_S), "the gated fit never started"
        return thread, out


def finishes(fn, *args):
    """fn(*args) run in a thread -> its result, or None when it has not returned within WAIT_S (it is blocked)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    thread.join(WAIT_S)
    return out[0] if out else None


@pytest.fixture
def job():
    return f"live-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def gate(monkeypatch):
    g = Gate(monkeypatch)
    yield g
    g.opened.set()  # never leave a thread waiting, whatever failed


def test_reads_answer_the_installed_fit_while_the_next_one_runs(gate, job):
    forecasts = jobs.Forecasts()
    for v in range(12):
        forecasts.add_point(point(job, v))
    thread, added = gate.run_gated(forecasts.add_point, point(job, 12))

    read = finishes(forecasts.forecast, job)
    assert read is not None, "GetForecast waited for a fit"
    assert read.model == "sigmoid" and read.num_points == 12  # the installed fit, not a half-made one
    assert len(finishes(forecasts.points, job)) == 13  # the point is stored before its fit
    assert finishes(forecasts.decision, job, 0.6) is not None, "GetDecision waited for a fit"

    gate.opened.set()
    thread.join(WAIT_S)
    assert added[0].num_points == 13
    assert forecasts.forecast(job).num_points == 13


def test_a_curve_whose_first_fit_runs_answers_without_a_fit(gate, job):
    forecasts = jobs.Forecasts()
    thread, _ = gate.run_gated(forecasts.add_point, point(job, 0))
    read = finishes(forecasts.forecast, job)
    assert read is not None and read.model == "" and read.num_points == 1
    assert any("first fit is running" in w for w in read.warnings)
    gate.opened.set()
    thread.join(WAIT_S)
    assert "first fit is running" not in " ".join(forecasts.forecast(job).warnings)


def test_another_job_and_another_eval_set_fit_while_one_curve_is_fitting(gate, job):
    forecasts = jobs.Forecasts()
    other = f"{job}-other"
    for v in range(11):
        forecasts.add_point(point(job, v))
        forecasts.add_point(point(other, v))
    thread, _ = gate.run_gated(forecasts.add_point, point(job, 11))

    f = finishes(forecasts.add_point, point(other, 11))
    assert f is not None, "another job's point waited for this job's fit"
    assert f.model == "sigmoid" and f.num_points == 12
    s = finishes(forecasts.add_point, point(job, 11), "", "math")
    assert s is not None and s.num_points == 1, "an eval set's point waited for the iid curve's fit"

    gate.opened.set()
    thread.join(WAIT_S)


def test_points_that_arrive_during_a_fit_share_the_next_fit(gate, job):
    forecasts = jobs.Forecasts()
    for v in range(12):
        forecasts.add_point(point(job, v))
    first, first_out = gate.run_gated(forecasts.add_point, point(job, 12))
    calls_before = gate.calls

    results: list = []
    waiters = [threading.Thread(target=lambda v=v: results.append(forecasts.add_point(point(job, v))), daemon=True)
               for v in range(13, 18)]
    for t in waiters:
        t.start()
    for _ in range(int(WAIT_S / 0.01)):  # every point stored, each caller waiting for a fit that covers it
        if len(forecasts.points(job)) == 18:
            break
        threading.Event().wait(0.01)
    assert len(forecasts.points(job)) == 18
    assert gate.calls == calls_before  # nobody started a second fit of the curve beside the running one

    gate.opened.set()
    for t in [first, *waiters]:
        t.join(WAIT_S)
    assert first_out[0].num_points == 13  # the fit that was running covers the points it began with
    assert [f.num_points for f in results] == [18] * 5  # the five points share one fit of all 18
    assert gate.calls == calls_before + 1
    assert forecasts.forecast(job).num_points == 18


def test_a_fit_that_raises_lets_the_next_caller_fit(monkeypatch, job):
    forecasts = jobs.Forecasts()
    real = jobs.fit_curve

    def interrupted(*args, **kwargs):
        raise Interrupted

    monkeypatch.setattr(jobs, "fit_curve", interrupted)
    with pytest.raises(Interrupted):
        forecasts.add_point(point(job, 0))
    assert "not fitted yet: the first fit did not finish" in forecasts.forecast(job).warnings
    monkeypatch.setattr(jobs, "fit_curve", real)
    for v in range(1, 12):
        forecasts.add_point(point(job, v))
    monkeypatch.setattr(jobs, "fit_curve", interrupted)
    with pytest.raises(Interrupted):
        forecasts.add_point(point(job, 12))
    assert forecasts.forecast(job).num_points == 12  # the fit before stays installed
    monkeypatch.setattr(jobs, "fit_curve", real)
    f = finishes(forecasts.add_point, point(job, 13))
    assert f is not None and f.num_points == 14


def test_a_fit_that_raises_wakes_the_caller_waiting_for_the_next(gate, job):
    forecasts = jobs.Forecasts()
    for v in range(12):
        forecasts.add_point(point(job, v))
    gate.fail = True
    first, first_out = gate.run_gated(forecasts.add_point, point(job, 12))
    waited: list = []
    waiting = threading.Thread(target=lambda: waited.append(forecasts.add_point(point(job, 13))), daemon=True)
    waiting.start()
    for _ in range(int(WAIT_S / 0.01)):
        if len(forecasts.points(job)) == 14:
            break
        threading.Event().wait(0.01)
    gate.opened.set()
    first.join(WAIT_S)
    waiting.join(WAIT_S)
    assert isinstance(first_out[0], Interrupted)
    assert waited and waited[0].num_points == 14, "the waiting caller was not woken to fit the curve itself"


def series(name: str, job_id: str) -> dict[str, float]:
    return {s.labels["point"]: s.value for fam in REGISTRY.collect() for s in fam.samples
            if s.name == name and s.labels.get("job_id") == job_id}


def test_a_long_curve_exports_a_bounded_number_of_points(tmp_path, job):
    n = 3 * metrics.POINTS_SHOWN + 7
    log = PointLog(tmp_path)
    for v in range(n):
        log.append(point(job, v), "")
    forecasts = jobs.Forecasts(state_dir=tmp_path)  # replayed: one fit of the whole curve
    assert forecasts.forecast(job).num_points == n
    values = series("scalerl_forecaster_point_pass_rate", job)
    compute = series("scalerl_forecaster_point_compute_device_hours", job)
    assert len(values) == len(compute) == metrics.POINTS_SHOWN
    xs = [compute[str(i)] for i in range(metrics.POINTS_SHOWN)]
    assert xs[0] == point(job, 0).compute and xs[-1] == point(job, n - 1).compute
    assert all(b > a for a, b in zip(xs, xs[1:]))  # distinct measured points, in order
    gaps = np.diff(xs)
    assert gaps.max() - gaps.min() <= 2.0 * 2.0  # evenly spread: index gaps differ by at most one point
    for i, x in enumerate(xs):
        assert values[str(i)] == point(job, int(round(x / 2.0))).value  # a measured point, not an average
    assert REGISTRY.get_sample_value("scalerl_forecaster_points", {"job_id": job}) == n
    metrics.forget_job(job)
