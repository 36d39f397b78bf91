"""A job through the whole stack: several learner steps, new weights reach the generators, validation points
reach the forecaster, the REST API reports them, every service answers health checks and exports its metrics."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scalerl.serving import channel, check_health
from scalerl_stack.supervisor import HEALTH_NAMES
from scalerl.v1 import common_pb2, replay_buffer_pb2, replay_buffer_pb2_grpc

from e2e_support import tiny_recipe, wait_for

pytestmark = pytest.mark.e2e

RECIPE = tiny_recipe(
    # Forced interruption fires: the tiny model answers in 2-5 tokens, so budgets of 3 or 4 cut some answers.
    generation={"forced_interruption": True, "thinking_budget_low": 3, "thinking_budget_high": 24,
                "interruption_phrase": "</think>"},
    # every 4 steps: 6 points past compute 0, the fewest a sigmoid fit with R0 from the first point accepts
    validation={"every_steps": 4,
                "eval_sets": [{"task": "arithmetic", "name": "arith-sample", "num_prompts": 8,
                               "samples_per_prompt": 1},
                              # a user's benchmark file: every record is evaluated
                              {"task": "file", "name": "sums-3digit", "num_prompts": 8, "samples_per_prompt": 1,
                               "verifier": "exact_numeric",
                               "dataset": {"path": str(Path(__file__).parent / "data/sums-3digit.jsonl"),
                                           "prompt_field": "question", "answer_field": "answer",
                                           "id_field": "id"}}]},
    budget={"max_steps": 24, "checkpoint_every_steps": 12},
)
EXPORTED = [line.strip() for line in
            (Path(__file__).parents[1] / "helm/tests/exported_metrics.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def test_every_service_is_serving(stack):
    s, _ = stack
    for proc in s.procs:
        assert check_health(proc.addr, HEALTH_NAMES[proc.service]) == "SERVING", proc.name
        assert check_health(proc.addr) == "SERVING", proc.name


def scrape_families(stack) -> set[str]:
    s, _ = stack
    names: set[str] = set()
    for proc in s.procs:
        text = httpx.get(f"http://127.0.0.1:{proc.metrics_port}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            names.add(family.name)
            if family.type == "counter":
                names.add(family.name + "_total")
    return names


class VersionSpanWatch:
    """Peeks (XRANGE, read-only) at the groups waiting in the job's buffer stream until stopped: the most policy
    versions seen in one completion's per-token spans. Two or more: a weight update landed while that
    completion was being sampled (entries leave the stream once trained, so it is watched during the run)."""

    def __init__(self, redis_url: str, job_id: str):
        import redis

        self.client = redis.Redis.from_url(redis_url)
        self.stream = f"scalerl:{job_id}:stream"
        self.most_versions = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            for _, fields in self.client.xrange(self.stream):
                group = common_pb2.ScoredGroup.FromString(fields[b"g"])
                for scored in group.completions:
                    versions = {span.version for span in scored.completion.versions}
                    self.most_versions = max(self.most_versions, len(versions))

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        self.client.close()
        return self.most_versions


def test_job_runs_end_to_end(stack, api):
    s, _ = stack
    job = api.post("/v1/jobs", json={"recipe": RECIPE, "name": "e2e"}).json()
    job_id = job["id"]
    spans = VersionSpanWatch(s.redis_url, job_id)

    # Several learner steps; checks that need the job still running come first.
    wait_for(lambda: api.get(f"/v1/jobs/{job_id}").json()["step"] >= 3, 600, what="3 learner steps")
    families_during = scrape_families(stack)

    # The learner reports each step's generator-vs-learner mismatch for the job (the panel that shows a weight
    # update which did not land): set, finite, in range.
    learner = next(p for p in s.procs if p.name == "learner")
    text = httpx.get(f"http://127.0.0.1:{learner.metrics_port}/metrics", timeout=10).text
    mismatch = {sample.name: sample.value for family in text_string_to_metric_families(text)
                for sample in family.samples if sample.labels.get("job_id") == job_id}
    assert 0.0 <= mismatch["scalerl_learner_sampler_kl"] < 0.5, mismatch
    assert 0.0 <= mismatch["scalerl_learner_clipped_token_ratio"] <= 1.0, mismatch
    assert 0.0 < mismatch["scalerl_learner_importance_ratio_max"] < 100.0, mismatch

    # Accounting invariant, mid-run: written = trained + dropped(stale, zero-variance, failed) + pending.
    buffer = next(p for p in s.procs if p.name == "replay-buffer")
    with channel(buffer.addr) as ch:
        st = replay_buffer_pb2_grpc.ReplayBufferStub(ch).GetStats(
            replay_buffer_pb2.GetStatsRequest(job_id=job_id), timeout=5)
    assert st.groups_written > 0 and st.groups_trained > 0
    assert st.groups_written == (st.groups_trained + st.dropped_stale + st.dropped_zero_variance
                                 + st.dropped_failed_to_grade + st.pending)

    # New weights reached every rollout generator in flight, and forced interruption cut some completion. A
    # replica exports the version it loaded, its completions and interruptions for the job while the job runs
    # (its series go when the job ends), so the polls keep the most each one showed. A replica whose engine came
    # up only as the job ended served nothing and is not in flight (CI, 2 cores: one took 15 s to start while
    # the 24-step job took 10 s); every one that served must have loaded new weights, and one at least served.
    generators = [p for p in s.procs if p.name.startswith("generator-")]
    seen = {p.name: {"version": 0.0, "completions": 0.0, "interruptions": 0.0} for p in generators}
    names = {"scalerl_generator_policy_version": "version", "scalerl_generator_completions_total": "completions",
             "scalerl_generator_interruptions_total": "interruptions"}

    def poll() -> bool:
        for p in generators:
            text = httpx.get(f"http://127.0.0.1:{p.metrics_port}/metrics", timeout=10).text
            now = {key: 0.0 for key in names.values()}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name in names and sample.labels.get("job_id") == job_id:
                        key = names[sample.name]  # the gauge's most; the counters summed over their labels
                        now[key] = max(now[key], sample.value) if key == "version" else now[key] + sample.value
            for key, value in now.items():
                seen[p.name][key] = max(seen[p.name][key], value)
        if all(g["version"] >= 1 for g in seen.values()) and any(g["interruptions"] for g in seen.values()):
            return True
        return api.get(f"/v1/jobs/{job_id}").json()["state"] in ("succeeded", "failed", "cancelled")

    wait_for(poll, 300, what="new weights on every generator and an interruption, or the job's end")
    served = {name: g for name, g in seen.items() if g["completions"] > 0 or g["version"] >= 1}
    assert served, f"no generator served the job: {seen}"
    assert all(g["version"] >= 1 for g in served.values()), f"a generator served on the first weights only: {seen}"
    assert any(g["interruptions"] > 0 for g in seen.values()), f"no completion cut by forced interruption: {seen}"

    final = wait_for(lambda: (j := api.get(f"/v1/jobs/{job_id}").json())["state"] in
                     ("succeeded", "failed", "cancelled") and j, 900, what="job to end")
    most_versions_in_one_completion = spans.close()
    assert final["state"] == "succeeded", final["reason"]
    assert final["step"] == 24 and final["policy_version"] >= 24
    # in-flight updates: some completion was sampled partly by one policy version, partly by a newer one
    assert most_versions_in_one_completion >= 2
    c = final["compute"]
    assert c["learner_device_hours"] > 0 and c["generator_device_hours"] > 0 and c["generated_tokens"] > 0
    # the total is the forecast's x-axis: learner + rollout generators, the evaluator reported apart
    assert c["evaluator_device_hours"] > 0
    assert c["total_device_hours"] == pytest.approx(c["learner_device_hours"] + c["generator_device_hours"])

    # Validation points of versions 0, 4, ..., 24 reached the forecaster; the REST API reports them.
    curve = api.get(f"/v1/jobs/{job_id}/curve").json()["points"]
    assert [p["policy_version"] for p in curve] == [0, 4, 8, 12, 16, 20, 24]
    computes = [p["compute"] for p in curve]
    assert computes[0] < computes[-1] and computes == sorted(computes)
    assert all(0.0 <= p["value"] <= 1.0 for p in curve)
    # Each downstream eval set was evaluated on the same pinned versions, on a curve of its own.
    for name in ("arith-sample", "sums-3digit"):  # 8 prompts x 1 sample each: pass rates in eighths
        downstream = api.get(f"/v1/jobs/{job_id}/curve", params={"set": name}).json()
        assert downstream["eval_set"] == name
        assert downstream["eval_sets"] == ["iid", "arith-sample", "sums-3digit"]
        assert [p["policy_version"] for p in downstream["points"]] == [0, 4, 8, 12, 16, 20, 24]
        assert [p["compute"] for p in downstream["points"]] == computes
        assert all(float(p["value"] * 8).is_integer() for p in downstream["points"]), downstream["points"]
    forecast = api.get(f"/v1/jobs/{job_id}/forecast").json()
    assert forecast["num_points"] == 7
    assert forecast["model"] == "sigmoid", forecast  # a fit, not a failed one with warnings
    assert set(forecast["params"]) == {"A", "B", "C_mid", "R0"} and 0.0 <= forecast["params"]["A"] <= 1.0

    # Metrics: every family the dashboards and alerts use is exported by a live service.
    missing = [m for m in EXPORTED if m not in families_during | scrape_families(stack)]
    assert not missing, f"dashboards/alerts use metrics nobody exports: {missing}"


def test_finished_job_keys_are_cleaned_up(stack, api):
    """Succeeded and cancelled jobs free their buffer keys at once; a failed job keeps them until deleted."""
    import redis

    s, _ = stack
    jobs = [j for j in api.get("/v1/jobs").json()["jobs"] if j["state"] in ("succeeded", "failed", "cancelled")]
    assert jobs, "runs after test_job_runs_end_to_end"
    client = redis.Redis.from_url(s.redis_url)
    for job in jobs:
        if job["state"] == "failed":
            assert api.delete(f"/v1/jobs/{job['id']}").status_code == 204
        assert list(client.scan_iter(match=f"scalerl:{job['id']}:*")) == []


def test_ppo_off_policy_mode_publishes_every_k_steps(stack, api):
    """PPO-off-policy-k: generators sample k batches with frozen weights, the learner takes k steps per version."""
    recipe = RECIPE | {"pipeline": RECIPE["pipeline"] | {"mode": "ppo_off_policy", "max_staleness": 2},
                       "validation": {"every_steps": 2, "num_prompts": 8, "samples_per_prompt": 1},
                       "budget": {"max_steps": 4, "checkpoint_every_steps": 4}}
    job = api.post("/v1/jobs", json={"recipe": recipe, "name": "e2e-ppo"}).json()
    final = wait_for(lambda: (j := api.get(f"/v1/jobs/{job['id']}").json())["state"] in
                     ("succeeded", "failed", "cancelled") and j, 900, what="PPO job to end")
    assert final["state"] == "succeeded", final["reason"]
    assert final["step"] == 4 and final["policy_version"] == 2  # v0, then one version per k = 2 steps
    curve = api.get(f"/v1/jobs/{job['id']}/curve").json()["points"]
    assert [p["policy_version"] for p in curve] == [0, 1, 2]


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGTERM"])
def test_the_demo_says_what_its_job_waits_for_and_ctrl_c_or_sigterm_cancels_it(stack, api, stop_signal):
    """`make run` after an interrupted one: its job is queued behind the other (one job runs at a time) and says
    so; Ctrl-C, or a SIGTERM (`kill`, `timeout`), cancels the job the command follows, so no later `make run`
    resumes it."""
    import os
    import signal
    import subprocess
    import sys

    _, url = stack
    ahead = api.post("/v1/jobs", json={"recipe": tiny_recipe(budget={"max_steps": 10_000})}).json()
    job = api.post("/v1/jobs", json={"recipe": tiny_recipe()}).json()
    env = {**os.environ, "SCALERL_API_URL": url, "SCALERL_API_TOKEN": api.headers["Authorization"].split()[-1]}
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; from scalerl_stack.demo import follow; "
                             f"sys.exit(130 if follow({job['id']!r}) is None else 0)"],
                            stdout=subprocess.PIPE, text=True, env=env,
                            # a shell's background job (`.ci/run &`) ignores SIGINT, and so would the child:
                            # the Ctrl-C under test would never arrive
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "waiting behind" in line:
                break
        assert ahead["id"] in lines[-1] and "python -m scalerl_stack cancel" in lines[-1], lines
        proc.send_signal(getattr(signal, stop_signal))
        rest = proc.stdout.read()
        assert proc.wait(60) == 130
        assert f"job {job['id']} cancelled" in rest
        assert api.get(f"/v1/jobs/{job['id']}").json()["state"] == "cancelled"
    finally:
        proc.kill()
        api.post(f"/v1/jobs/{ahead['id']}/cancel")
        api.post(f"/v1/jobs/{job['id']}/cancel")
    assert api.get(f"/v1/jobs/{ahead['id']}").json()["state"] == "cancelled"
