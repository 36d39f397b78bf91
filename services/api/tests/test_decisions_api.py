"""Compare jobs and scale-or-stop through REST, on a real forecaster behind a real gRPC server: synthetic curves of
known parameters in, verdicts and recommendations out; bad input is a 4xx naming the problem."""

from __future__ import annotations

import numpy as np

from scalerl.v1 import common_pb2

SMALL = {"validation": {"num_prompts": 8}, "task": {"num_train_prompts": 32, "num_validation_prompts": 8},
         "budget": {"max_steps": 3}, "forecast": {"min_compute": 0.0}}


def submit(client, recipe=SMALL, name=None):
    resp = client.post("/v1/jobs", json={"recipe": recipe} | ({"name": name} if name else {}))
    assert resp.status_code == 201, resp.text
    return resp.json()


def feed(forecaster, job, A=0.61, B=1.92, C_mid=25.0, end=200.0, n=30, seed=0):
    """Points of a known sigmoid (binomial noise of 16k samples), sent as the learner sends them."""
    import json

    from scalerl_forecaster.fit import sigmoid_curve

    rng = np.random.default_rng(seed)
    recipe_json = json.dumps(job["recipe"])
    for i, c in enumerate(np.concatenate([[0.0], np.linspace(end / n, end, n)])):
        value = rng.binomial(16_000, float(sigmoid_curve(c, A, B, C_mid, 0.3))) / 16_000
        forecaster.add_point(common_pb2.ValidationPoint(job_id=job["id"], step=i, policy_version=i, compute=float(c),
                                                        value=value), recipe_json)


def test_compare_calls_a_higher_ceiling_a_ceiling_mover(client, backend_addrs):
    a, b = submit(client, name="base"), submit(client, name="bigger-model")
    feed(backend_addrs["forecaster"], a, seed=1)
    feed(backend_addrs["forecaster"], b, A=0.67, seed=2)
    resp = client.get("/v1/compare", params={"jobs": f"{a['id']},{b['id']}"})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["verdict"] == "ceiling mover" and out["higher_ceiling"] == b["id"] and out["level"] == 0.95
    assert [j["job_id"] for j in out["jobs"]] == [a["id"], b["id"]]
    assert [p["name"] for p in out["params"]] == ["A", "B", "C_mid"]
    for job in out["jobs"]:
        assert set(job["params"]) == {"A", "B", "C_mid", "R0"} and set(job["intervals"]) >= {"A", "B", "C_mid"}
        assert len(job["points"]) == 31
    # one compute axis for both bands
    assert out["jobs"][0]["band"]["compute"] == out["jobs"][1]["band"]["compute"]
    assert out["warnings"] == []  # same model, same task


def test_compare_calls_a_later_midpoint_an_efficiency_shaper(client, backend_addrs):
    a, b = submit(client), submit(client)
    feed(backend_addrs["forecaster"], a, seed=3)
    feed(backend_addrs["forecaster"], b, C_mid=45.0, end=360.0, seed=4)
    out = client.get("/v1/compare", params={"jobs": f"{a['id']},{b['id']}"}).json()
    assert out["verdict"] == "efficiency shaper" and out["more_efficient"] == a["id"], out["summary"]


def test_compare_warns_when_models_or_tasks_differ(client, backend_addrs):
    other = SMALL | {"task": SMALL["task"] | {"num_validation_prompts": 16}}
    a, b = submit(client), submit(client, recipe=other)
    feed(backend_addrs["forecaster"], a, seed=5)
    feed(backend_addrs["forecaster"], b, seed=6)
    out = client.get("/v1/compare", params={"jobs": f"{a['id']},{b['id']}"}).json()
    assert any("different tasks" in w for w in out["warnings"]), out["warnings"]
    assert out["verdict"]  # still compared


def test_compare_bad_input_is_a_4xx_naming_the_problem(client, backend_addrs):
    a, unfitted = submit(client), submit(client)
    feed(backend_addrs["forecaster"], a, seed=7)
    resp = client.get("/v1/compare", params={"jobs": a["id"]})
    assert resp.status_code == 422 and "exactly two" in resp.json()["detail"]
    resp = client.get("/v1/compare", params={"jobs": f"{a['id']},{a['id']}"})
    assert resp.status_code == 422
    resp = client.get("/v1/compare")
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["query", "jobs"]
    resp = client.get("/v1/compare", params={"jobs": f"{a['id']},nope"})
    assert resp.status_code == 404 and "nope" in resp.json()["detail"]
    resp = client.get("/v1/compare", params={"jobs": f"{a['id']},{unfitted['id']}"})  # no points at all
    assert resp.status_code == 409 and unfitted["id"] in resp.json()["detail"]
    feed(backend_addrs["forecaster"], unfitted, n=2)  # too few points to fit
    resp = client.get("/v1/compare", params={"jobs": f"{a['id']},{unfitted['id']}"})
    assert resp.status_code == 409 and "no fit yet" in resp.json()["detail"] and unfitted["id"] in resp.json()["detail"]
    resp = client.get("/v1/compare", params={"jobs": f"{a['id']},{unfitted['id']}", "level": 1.5})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["query", "level"]


def test_decision_recommends_continue_stop_or_not_decidable(client, backend_addrs):
    early, mid, late = submit(client), submit(client), submit(client)
    feed(backend_addrs["forecaster"], early, end=12.0, seed=8)   # half of C_mid: not identifiable
    feed(backend_addrs["forecaster"], mid, end=60.0, seed=9)     # the rise is seen, gain ahead
    feed(backend_addrs["forecaster"], late, end=400.0, seed=10)  # far past the midpoint: at the ceiling
    d = client.get(f"/v1/jobs/{early['id']}/decision").json()
    assert d["recommendation"] == "not decidable yet" and not d["identifiable"], d
    assert d["compute_to_identify"] is None or d["compute_to_identify"] > d["spent"]
    d = client.get(f"/v1/jobs/{mid['id']}/decision", params={"target": 0.58}).json()
    assert d["recommendation"] == "continue", d["reason"]
    assert d["spent"] == 60.0 and [p["compute"] for p in d["predictions"]] == [120.0, 240.0, 600.0]
    assert d["target"] == 0.58 and d["compute_to_target"] > 60.0
    d = client.get(f"/v1/jobs/{late['id']}/decision").json()
    assert d["recommendation"] == "stop" and "ceiling reached within noise" in d["reason"]
    # the forecast carries the same advice at the recipe's target
    f = client.get(f"/v1/jobs/{late['id']}/forecast").json()
    assert f["decision"]["recommendation"] == "stop"


def test_decision_bad_input_is_a_4xx(client, backend_addrs):
    job = submit(client)
    assert client.get("/v1/jobs/nope/decision").status_code == 404
    resp = client.get(f"/v1/jobs/{job['id']}/decision")
    assert resp.status_code == 409 and "no fit yet" in resp.json()["detail"]
    feed(backend_addrs["forecaster"], job, seed=11)
    resp = client.get(f"/v1/jobs/{job['id']}/decision", params={"target": 2})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["query", "target"]


def test_decision_whose_target_some_curves_never_reach_is_json(client, backend_addrs):
    # early in a run a target near the ceiling is reached by the fitted curve but not by every bootstrap curve: the
    # interval on the compute to reach it is open above, which JSON cannot write as a number; it is null
    job = submit(client)
    feed(backend_addrs["forecaster"], job, end=12.0, seed=8)
    resp = client.get(f"/v1/jobs/{job['id']}/decision", params={"target": 0.6})
    assert resp.status_code == 200, resp.text
    d = resp.json()
    assert d["compute_to_target"] > d["spent"], d
    lo, hi = d["compute_to_target_interval"]
    assert lo <= d["compute_to_target"] and hi is None, d


def test_decision_on_a_target_past_the_fitted_ceiling_carries_the_bands_interval(client, backend_addrs):
    # the fitted curve never reaches a target just above its A, but the band does: no point, an interval open above
    job = submit(client)
    feed(backend_addrs["forecaster"], job, end=12.0, seed=8)
    A = client.get(f"/v1/jobs/{job['id']}/forecast").json()["params"]["A"]
    d = client.get(f"/v1/jobs/{job['id']}/decision", params={"target": round(A + 0.005, 4)}).json()
    assert d["compute_to_target"] is None, d
    lo, hi = d["compute_to_target_interval"]
    assert lo > d["spent"] and hi is None, d
