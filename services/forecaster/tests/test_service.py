"""The forecaster through a real gRPC server (the service bootstrap's, with its error interceptor): points of a
known sigmoid in, fitted curve and metrics out."""

from __future__ import annotations

import math
import uuid

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from scalerl.recipe import BudgetConfig, ForecastConfig, Recipe
from scalerl.serving import GRPC_OPTIONS, ServiceRegistration, start_server
from scalerl.v1 import common_pb2
from scalerl.v1 import forecaster_pb2 as pb
from scalerl.v1 import forecaster_pb2_grpc as pb_grpc
from scalerl_forecaster.fit import sigmoid_curve
from scalerl_forecaster.jobs import Forecasts
from scalerl_forecaster.metrics import CURVE_POINTS
from scalerl_forecaster.service import add_to_server

TRUE = dict(A=0.7, B=1.5, C_mid=20.0, R0=0.2)
N = 25  # points at compute 0, STEP, .., N * STEP
STEP = 2.0


class Running:
    def __init__(self, forecasts: Forecasts):
        self.forecasts = forecasts
        self.server = start_server(ServiceRegistration(["scalerl.v1.Forecaster"],
                                                       lambda s: add_to_server(s, forecasts)),
                                   host="127.0.0.1", grpc_port=0, metrics_port=None, max_workers=4)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.server.grpc_port}", options=GRPC_OPTIONS)
        self.stub = pb_grpc.ForecasterStub(self.channel)

    def close(self):
        self.channel.close()
        self.server.stop(0)


@pytest.fixture
def forecaster(tmp_path):
    running = Running(Forecasts(state_dir=tmp_path / "state"))
    yield running
    running.close()


@pytest.fixture
def job():
    return f"job-{uuid.uuid4().hex[:8]}"


def point(job_id, version, compute, value):
    return common_pb2.ValidationPoint(job_id=job_id, step=version * 10, policy_version=version, compute=compute,
                                      value=value)


def truth(compute):
    return float(sigmoid_curve(np.asarray([compute], dtype=float), **TRUE)[0])


def add(stub, p, recipe_json=""):
    return stub.AddPoint(pb.AddPointRequest(point=p, recipe_json=recipe_json), timeout=30)


def add_sigmoid(stub, job_id, order=None, recipe_json=""):
    order = list(range(N + 1)) if order is None else order
    forecast = None
    for i in order:
        forecast = add(stub, point(job_id, i, i * STEP, truth(i * STEP)), recipe_json)
    return forecast


def recipe(target: float, budget: float | None = None) -> str:
    return Recipe(budget=BudgetConfig(max_steps=1000, target_pass_rate=target, compute_device_hours=budget),
                  forecast=ForecastConfig(min_compute=0.0)).model_dump_json()


def gauge(name, **labels):
    return REGISTRY.get_sample_value(name, labels)


# ---------------------------------------------------------------------------------------------------------------


def test_forecast_recovers_a_known_sigmoid(forecaster, job):
    last = add_sigmoid(forecaster.stub, job)
    f = forecaster.stub.GetForecast(pb.GetForecastRequest(job_id=job))
    assert f == last
    assert f.model == "sigmoid" and f.num_points == N + 1
    assert f.a == pytest.approx(TRUE["A"], abs=0.01)
    assert f.b == pytest.approx(TRUE["B"], rel=0.05)
    assert f.c_mid == pytest.approx(TRUE["C_mid"], rel=0.05)
    assert f.r0 == pytest.approx(TRUE["R0"], abs=1e-9)  # the compute-0 point gives R0
    # intervals contain the estimates
    for name, est in (("A", f.a), ("B", f.b), ("C_mid", f.c_mid)):
        iv = f.intervals[name]
        assert iv.lo <= est <= iv.hi, name
    # without a recipe the budget is twice the latest compute
    (pred,) = f.predictions
    assert pred.compute == pytest.approx(2 * N * STEP)
    assert pred.value == pytest.approx(truth(2 * N * STEP), abs=0.01)
    assert pred.interval.lo <= pred.value <= pred.interval.hi
    assert f.compute_to_target == -1  # no target without a recipe


def test_too_few_points_is_not_fitted_yet(forecaster, job):
    f = add(forecaster.stub, point(job, 0, 0.0, 0.2))
    assert f.model == "" and f.num_points == 1
    assert any("not fitted yet" in w for w in f.warnings)
    assert gauge("scalerl_forecaster_identifiable", job_id=job) == 0
    assert forecaster.stub.GetForecast(pb.GetForecastRequest(job_id="unknown-job")).model == ""


def test_get_curve_returns_points_sorted_by_compute(forecaster, job):
    order = [5, 0, 3, 9, 1, 7]
    add_sigmoid(forecaster.stub, job, order=order)
    curve = forecaster.stub.GetCurve(pb.GetCurveRequest(job_id=job))
    assert curve.job_id == job
    assert [p.compute for p in curve.points] == sorted(i * STEP for i in order)
    assert [p.policy_version for p in curve.points] == sorted(order)
    assert curve.points[0].value == pytest.approx(TRUE["R0"])
    assert list(forecaster.stub.GetCurve(pb.GetCurveRequest(job_id="unknown-job")).points) == []


def test_revalidated_version_replaces_its_point(forecaster, job):
    add(forecaster.stub, point(job, 1, 1.0, 0.3))
    add(forecaster.stub, point(job, 1, 1.0, 0.35))
    (p,) = forecaster.stub.GetCurve(pb.GetCurveRequest(job_id=job)).points
    assert p.value == pytest.approx(0.35)


@pytest.mark.parametrize("field,kwargs", [
    ("value", dict(value=1.5)),
    ("value", dict(value=-0.1)),
    ("value", dict(value=math.nan)),
    ("compute", dict(compute=-1.0)),
    ("compute", dict(compute=math.inf)),
    ("compute", dict(compute=math.nan)),
    ("job_id", dict(job_id="")),
])
def test_invalid_points_are_rejected_naming_the_field(forecaster, job, field, kwargs):
    args = dict(job_id=job, policy_version=1, compute=1.0, value=0.5) | kwargs
    with pytest.raises(grpc.RpcError) as err:
        add(forecaster.stub, common_pb2.ValidationPoint(**args))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    if args["job_id"]:
        assert list(forecaster.stub.GetCurve(pb.GetCurveRequest(job_id=job)).points) == []


@pytest.mark.parametrize("bad,field", [
    ('{"budget": 3}', "recipe_json.budget"),
    ('{"forecast": {"level": 2}}', "recipe_json.forecast.level"),
    ("{not json", "recipe_json"),
])
def test_invalid_recipe_is_invalid_argument_naming_the_field(forecaster, job, bad, field):
    with pytest.raises(grpc.RpcError) as err:
        add(forecaster.stub, point(job, 0, 0.0, 0.2), bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}: ")
    assert list(forecaster.stub.GetCurve(pb.GetCurveRequest(job_id=job)).points) == []


def test_recipe_gives_compute_to_target_and_budget(forecaster, job):
    target, budget = 0.6, 100.0
    f = add_sigmoid(forecaster.stub, job, recipe_json=recipe(target, budget))
    # truth: C = C_mid / ((A - R0) / (t - R0) - 1)^(1/B)
    s = (target - TRUE["R0"]) / (TRUE["A"] - TRUE["R0"])
    expected = TRUE["C_mid"] / (1 / s - 1) ** (1 / TRUE["B"])
    assert f.compute_to_target == pytest.approx(expected, rel=0.05)
    (pred,) = f.predictions
    assert pred.compute == pytest.approx(budget)
    assert pred.value == pytest.approx(truth(budget), abs=0.01)
    assert gauge("scalerl_forecaster_target_pass_rate", job_id=job) == pytest.approx(target)
    assert gauge("scalerl_forecaster_compute_to_target_device_hours", job_id=job) == pytest.approx(
        f.compute_to_target)


def test_unreachable_target_is_minus_one(forecaster, job):
    f = add_sigmoid(forecaster.stub, job, recipe_json=recipe(0.95))
    assert f.compute_to_target == -1


def test_recipe_sent_after_the_first_points_is_used(forecaster, job):
    add_sigmoid(forecaster.stub, job, order=list(range(N)))
    f = add(forecaster.stub, point(job, N, N * STEP, truth(N * STEP)), recipe(0.6))
    assert f.compute_to_target > 0


def test_state_is_restored_by_a_second_service(tmp_path, job):
    state = tmp_path / "state"
    first = Running(Forecasts(state_dir=state))
    try:
        original = add_sigmoid(first.stub, job, recipe_json=recipe(0.6))
        curve = first.stub.GetCurve(pb.GetCurveRequest(job_id=job))
    finally:
        first.close()
    second = Running(Forecasts(state_dir=state))
    try:
        assert second.stub.GetCurve(pb.GetCurveRequest(job_id=job)) == curve
        restored = second.stub.GetForecast(pb.GetForecastRequest(job_id=job))
        assert restored.num_points == N + 1
        assert restored.a == pytest.approx(original.a)
        assert restored.compute_to_target == pytest.approx(original.compute_to_target)  # the recipe too
        # and it keeps going
        f = add(second.stub, point(job, N + 1, (N + 1) * STEP, truth((N + 1) * STEP)))
        assert f.num_points == N + 2
    finally:
        second.close()


def test_job_id_cannot_escape_the_state_dir(tmp_path):
    state = tmp_path / "state"
    running = Running(Forecasts(state_dir=state))
    evil = "../../escaped"
    try:
        add(running.stub, point(evil, 0, 0.0, 0.2))
    finally:
        running.close()
    assert not list(tmp_path.parent.parent.glob("escaped*"))
    assert [p.parent for p in state.glob("*.jsonl")] == [state]
    again = Running(Forecasts(state_dir=state))
    try:
        assert len(again.stub.GetCurve(pb.GetCurveRequest(job_id=evil)).points) == 1
    finally:
        again.close()


def test_prometheus_gauges_are_exported(forecaster, job):
    f = add_sigmoid(forecaster.stub, job)
    assert gauge("scalerl_forecaster_points", job_id=job) == N + 1
    for name, value in (("A", f.a), ("B", f.b), ("C_mid", f.c_mid), ("R0", f.r0)):
        assert gauge("scalerl_forecaster_fit_param", job_id=job, param=name) == pytest.approx(value)
    assert gauge("scalerl_forecaster_fit_param_lower", job_id=job, param="A") == pytest.approx(f.intervals["A"].lo)
    assert gauge("scalerl_forecaster_fit_param_upper", job_id=job, param="A") == pytest.approx(f.intervals["A"].hi)
    assert gauge("scalerl_forecaster_predicted_pass_rate", job_id=job) == pytest.approx(f.predictions[0].value)
    assert gauge("scalerl_forecaster_validation_pass_rate", job_id=job) == pytest.approx(truth(N * STEP))
    assert gauge("scalerl_forecaster_validation_compute_device_hours", job_id=job) == N * STEP
    assert gauge("scalerl_forecaster_identifiable", job_id=job) == (1 if f.identifiable else 0)
    # the fitted curve and its band, sampled from 0 to the budget
    last = str(CURVE_POINTS - 1)
    assert gauge("scalerl_forecaster_curve_compute_device_hours", job_id=job, point="0") == 0
    assert gauge("scalerl_forecaster_curve_compute_device_hours", job_id=job, point=last) == pytest.approx(2 * N * STEP)
    assert gauge("scalerl_forecaster_curve_pass_rate", job_id=job, point="0", kind="fit") == pytest.approx(
        TRUE["R0"], abs=1e-6)
    for i in range(CURVE_POINTS):
        c = gauge("scalerl_forecaster_curve_compute_device_hours", job_id=job, point=str(i))
        fit = gauge("scalerl_forecaster_curve_pass_rate", job_id=job, point=str(i), kind="fit")
        lo = gauge("scalerl_forecaster_curve_pass_rate", job_id=job, point=str(i), kind="lower")
        hi = gauge("scalerl_forecaster_curve_pass_rate", job_id=job, point=str(i), kind="upper")
        assert fit == pytest.approx(truth(c), abs=0.01)
        assert lo <= fit <= hi
