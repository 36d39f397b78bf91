"""Downstream eval sets through REST on a real forecaster: a set's own curve and fit (`?set=`), the correlations
with iid validation, and clear 4xx for unknown or malformed set names."""

from __future__ import annotations

import numpy as np

from scalerl.v1 import common_pb2

RECIPE = {"validation": {"num_prompts": 8, "eval_sets": [{"task": "arithmetic", "name": "arith-hard"}]},
          "task": {"num_train_prompts": 32, "num_validation_prompts": 8}, "budget": {"max_steps": 3},
          "forecast": {"min_compute": 0.0}}


def feed(forecaster, job_id, eval_set, A, versions, seed):
    from scalerl_forecaster.fit import sigmoid_curve

    rng = np.random.default_rng(seed)
    for v in versions:
        value = rng.binomial(4000, float(sigmoid_curve(2.0 * v, A, 1.5, 20.0, 0.2))) / 4000
        forecaster.add_point(common_pb2.ValidationPoint(job_id=job_id, step=v, policy_version=v, compute=2.0 * v,
                                                        value=value), "", eval_set)


def test_a_set_has_its_own_curve_fit_and_correlation(client, backend_addrs):
    job = client.post("/v1/jobs", json={"recipe": RECIPE}).json()
    assert job["recipe"]["validation"]["eval_sets"][0]["name"] == "arith-hard"
    feed(backend_addrs["forecaster"], job["id"], "", 0.7, range(26), seed=1)
    feed(backend_addrs["forecaster"], job["id"], "arith-hard", 0.4, range(26), seed=2)
    iid = client.get(f"/v1/jobs/{job['id']}/curve").json()
    hard = client.get(f"/v1/jobs/{job['id']}/curve", params={"set": "arith-hard"}).json()
    assert iid["eval_set"] == "iid" and hard["eval_set"] == "arith-hard"
    assert hard["eval_sets"] == ["iid", "arith-hard"] and len(hard["points"]) == 26
    assert [p["value"] for p in hard["points"]] != [p["value"] for p in iid["points"]]
    f_iid = client.get(f"/v1/jobs/{job['id']}/forecast").json()
    f_hard = client.get(f"/v1/jobs/{job['id']}/forecast", params={"set": "arith-hard"}).json()
    assert f_hard["params"]["A"] < f_iid["params"]["A"] - 0.2
    corr = client.get(f"/v1/jobs/{job['id']}/correlations").json()
    (s,) = corr["sets"]
    assert s["eval_set"] == "arith-hard" and s["num_versions"] == 26 and s["enough_points"]
    assert s["spearman"] > 0.8 and s["interval"][0] > 0


def test_too_few_shared_versions_is_said(client, backend_addrs):
    job = client.post("/v1/jobs", json={"recipe": RECIPE}).json()
    feed(backend_addrs["forecaster"], job["id"], "", 0.7, range(10), seed=3)
    feed(backend_addrs["forecaster"], job["id"], "arith-hard", 0.4, range(3), seed=4)
    (s,) = client.get(f"/v1/jobs/{job['id']}/correlations").json()["sets"]
    assert not s["enough_points"] and s["spearman"] is None and "too few points" in s["note"]


def test_unknown_or_malformed_sets_are_4xx(client, backend_addrs):
    job = client.post("/v1/jobs", json={"recipe": RECIPE}).json()
    resp = client.get(f"/v1/jobs/{job['id']}/correlations")
    assert resp.status_code == 409 and "no validation points" in resp.json()["detail"]
    feed(backend_addrs["forecaster"], job["id"], "", 0.7, range(3), seed=5)
    resp = client.get(f"/v1/jobs/{job['id']}/curve", params={"set": "nope"})
    assert resp.status_code == 404 and "'nope'" in resp.json()["detail"] and "iid" in resp.json()["detail"]
    resp = client.get(f"/v1/jobs/{job['id']}/curve", params={"set": "bad name!"})
    assert resp.status_code == 422 and resp.json()["detail"][0]["loc"] == ["query", "set"]
    resp = client.post("/v1/jobs", json={"recipe": RECIPE | {"validation": {"eval_sets": [{"task": "astrology"}]}}})
    assert resp.status_code == 422
    assert ["body", "recipe", "validation", "eval_sets", 0, "task"] in [e["loc"] for e in resp.json()["detail"]]
