from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from scalerl.v1 import common_pb2

SMALL = {"validation": {"num_prompts": 8}, "task": {"num_train_prompts": 32, "num_validation_prompts": 8},
         "budget": {"max_steps": 3}}


def submit(client, recipe=SMALL, **extra):
    resp = client.post("/v1/jobs", json={"recipe": recipe, **extra})
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_submit_returns_queued_job_with_paper_defaults(client):
    job = submit(client, name="ablation-1")
    assert job["state"] == "queued" and job["name"] == "ablation-1"
    assert job["recipe"]["loss"]["type"] == "cispo"
    assert job["recipe"]["loss"]["aggregation"] == "prompt"
    assert job["recipe"]["pipeline"]["max_staleness"] == 8
    assert job["recipe"]["optimizer"]["adam_eps"] == 1e-15
    assert client.get(f"/v1/jobs/{job['id']}").json()["id"] == job["id"]
    listed = client.get("/v1/jobs").json()
    assert job["id"] in [j["id"] for j in listed["jobs"]]


@pytest.mark.parametrize("recipe, loc", [
    # a loss's fields sit under its type: loss.<type>.<field>
    ({"loss": {"eps_max": -1}}, ["body", "recipe", "loss", "cispo", "eps_max"]),
    ({"loss": {"type": "grpo", "eps_max": 4}}, ["body", "recipe", "loss", "grpo", "eps_max"]),
    ({"pipeline": {"max_staleness": "eight"}}, ["body", "recipe", "pipeline", "max_staleness"]),
    ({"optimiser": {}}, ["body", "recipe", "optimiser"]),
])
def test_malformed_recipe_is_422_naming_the_field(client, recipe, loc):
    resp = client.post("/v1/jobs", json={"recipe": recipe})
    assert resp.status_code == 422
    assert loc in [err["loc"] for err in resp.json()["detail"]]
    assert client.get("/v1/jobs").json()["count"] == 0  # nothing stored


def test_unknown_loss_type_is_422_naming_type(client):
    resp = client.post("/v1/jobs", json={"recipe": {"loss": {"type": "ppo2"}}})
    assert resp.status_code == 422
    (err,) = resp.json()["detail"]
    assert err["loc"] == ["body", "recipe", "loss"] and "type must be one of" in err["msg"]
    assert client.get("/v1/jobs").json()["count"] == 0


@pytest.mark.parametrize("task, loc, words", [
    ({"name": "astrology"}, ["body", "recipe", "task", "name"], "unknown task 'astrology'"),
    ({"name": "reasoning_gym"}, ["body", "recipe", "task", "name"], "reasoning_gym/<dataset>"),
    ({"verifier": "tarot"}, ["body", "recipe", "task", "verifier"], "unknown verifier 'tarot'"),
    ({"verifier": "reasoning_gym"}, ["body", "recipe", "task", "verifier"], "cannot be graded by"),
])
def test_unknown_task_or_verifier_is_422_at_submit(client, task, loc, words):
    resp = client.post("/v1/jobs", json={"recipe": SMALL | {"task": SMALL["task"] | task}})
    assert resp.status_code == 422
    (err,) = resp.json()["detail"]
    assert err["loc"] == loc and words in err["msg"], err
    assert client.get("/v1/jobs").json()["count"] == 0  # refused at submit, not a job that fails later


def test_registered_task_and_verifier_are_accepted(client):
    job = submit(client, recipe=SMALL | {"task": SMALL["task"] | {"name": "reasoning_gym/basic_arithmetic",
                                                                  "verifier": "math"}})
    assert (job["recipe"]["task"]["name"], job["recipe"]["task"]["verifier"]) == ("reasoning_gym/basic_arithmetic",
                                                                                    "math")
    assert submit(client)["recipe"]["task"]["verifier"] is None  # default: the task's own


def test_cross_field_error_names_the_fields(client):
    resp = client.post("/v1/jobs", json={"recipe": {"generation": {"thinking_budget_low": 9, "thinking_budget_high": 3}}})
    assert resp.status_code == 422
    assert "thinking_budget_low" in resp.text


def test_unauthenticated_is_401(app):
    with TestClient(app) as anonymous:
        assert anonymous.get("/v1/jobs").status_code == 401
        assert anonymous.post("/v1/jobs", json={}).status_code == 401
        wrong = anonymous.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert anonymous.get("/healthz").status_code == 200


def test_unknown_job_is_404(client):
    for method, path in [("get", "/v1/jobs/nope"), ("post", "/v1/jobs/nope/cancel"),
                         ("get", "/v1/jobs/nope/curve"), ("get", "/v1/jobs/nope/forecast")]:
        assert getattr(client, method)(path).status_code == 404, path


def test_cancel_then_cancel_again_conflicts(client):
    job = submit(client)
    resp = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert resp.json()["state"] == "cancelled"
    assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 409


def test_openapi_is_served(client):
    spec = client.get("/openapi.json").json()
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel", "/v1/jobs/{job_id}/curve",
            "/v1/jobs/{job_id}/forecast", "/v1/admin/generators/scale"} <= set(spec["paths"])


def test_curve_and_forecast_come_from_the_forecaster(client, backend_addrs):
    job = submit(client, recipe=SMALL | {"forecast": {"min_compute": 0}})
    forecaster = backend_addrs["forecaster"]
    from scalerl_forecaster.fit import sigmoid_curve

    for i, c in enumerate([0.0, 1, 2, 4, 6, 8, 10, 12, 16, 20, 24, 28, 32]):
        value = float(sigmoid_curve(c, 0.8, 2.0, 8.0, 0.1)) if c else 0.1
        forecaster.add_point(common_pb2.ValidationPoint(job_id=job["id"], step=i, policy_version=i, compute=c,
                                                        value=value))
    curve = client.get(f"/v1/jobs/{job['id']}/curve").json()
    assert [p["step"] for p in curve["points"]] == list(range(13))
    forecast = client.get(f"/v1/jobs/{job['id']}/forecast").json()
    assert forecast["model"] == "sigmoid"
    assert forecast["params"]["A"] == pytest.approx(0.8, abs=0.01)
    assert forecast["num_points"] == 13


def test_scale_refused_outside_bounds_without_cluster(client):
    assert client.post("/v1/admin/generators/scale", json={"replicas": -1}).status_code == 422
    # No Kubernetes API is reachable from the test: a clear 503, not a crash.
    assert client.post("/v1/admin/generators/scale", json={"replicas": 2}).status_code in (422, 503)


def test_unreachable_forecaster_is_503_not_500(database_url):
    from scalerl.settings import Settings
    from scalerl_api.backends import Backends
    from scalerl_api.main import create_app

    settings = Settings(database_url=database_url, api_token="t", forecaster_addr="127.0.0.1:1",
                        replay_buffer_addr="127.0.0.1:1")
    backends = Backends(settings)
    with TestClient(create_app(settings, backends), headers={"Authorization": "Bearer t"}) as c:
        job = submit(c)
        # side by side: each waits out its call's deadline for a forecaster that may be restarting
        with ThreadPoolExecutor(2) as pool:
            replies = list(pool.map(lambda path: c.get(f"/v1/jobs/{job['id']}/{path}"), ("curve", "forecast")))
        for resp in replies:
            assert resp.status_code == 503 and "forecaster" in resp.json()["detail"]
    backends.close()
