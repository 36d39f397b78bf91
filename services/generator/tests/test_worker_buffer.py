"""The generator's JobWorker on the real vLLM CPU engine against a real replay-buffer (gRPC + Valkey) and a real
reward-grader: a partial lease is generated, not dropped (issue 14 a); leases of long generations are renewed
(h); the evaluator leaves failed-to-grade completions out of the pass rate (b)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
import uuid

import pytest
import redis

from scalerl import errors
from scalerl.recipe import Recipe
from scalerl.serving import ServiceRegistration, start_server
from scalerl.settings import Settings
from scalerl.tasks import build_prompts
from scalerl.v1 import common_pb2
from scalerl_replay_buffer.store import BufferStore
from scalerl_replay_buffer.testing import redis_url, start_buffer_server  # noqa: F401  (fixture)
from scalerl_reward_grader.grading import Grader
from scalerl_reward_grader.service import add_to_server as add_grader


@pytest.fixture
def servers(redis_url):
    """(replay-buffer addr, reward-grader addr, BufferStore on the same Valkey)."""
    client = redis.Redis.from_url(redis_url)
    buffer = start_buffer_server(client)
    grader = start_server(ServiceRegistration(["scalerl.v1.RewardGrader"], lambda s: add_grader(s, Grader())),
                          host="127.0.0.1", grpc_port=0, metrics_port=None, max_workers=8)
    store = BufferStore(client)
    yield f"127.0.0.1:{buffer.grpc_port}", f"127.0.0.1:{grader.grpc_port}", store
    buffer.stop(0)
    grader.stop(0)
    client.close()


def make_worker(servers, engine, loop, tmp_path, **recipe_overrides):
    from scalerl_generator.worker import JobWorker

    buffer_addr, grader_addr, store = servers
    recipe = Recipe(**{"model": {"max_model_len": 128}, "task": {"num_train_prompts": 64},
                       "generation": {"thinking_budget_low": 8, "thinking_budget_high": 8, "solution_budget": 4,
                                      "forced_interruption": False},
                       **recipe_overrides})
    job_id = f"w-{uuid.uuid4().hex[:10]}"
    store.init_job(job_id, recipe)
    settings = Settings(replay_buffer_addr=buffer_addr, reward_grader_addr=grader_addr,
                        weight_transport={"type": "filesystem", "root": str(tmp_path / "weights")})
    worker = JobWorker(settings, common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json()),
                       threading.Event(), "gen-test")
    worker.engine, worker.tokenizer, worker.loop = engine, engine.tokenizer, loop.loop

    async def lock():
        worker.update_lock = asyncio.Lock()
    loop.run(lock())
    return worker, job_id


def run_until(worker, loop, done, timeout_s: float = 180.0) -> bool:
    """Run the rollout loop until done() holds (or the timeout), then stop it."""
    future = asyncio.run_coroutine_threadsafe(worker.rollout_loop(max_in_flight=8), loop.loop)
    deadline = time.monotonic() + timeout_s
    ok = False
    while time.monotonic() < deadline and not future.done():
        if done():
            ok = True
            break
        time.sleep(0.1)
    worker.stop.set()
    future.result(timeout=60)
    return ok


def test_partial_lease_is_generated_not_dropped(servers, engine, loop, tmp_path):
    store = servers[2]
    # backpressure bound (k + 1) * prompts_per_batch = 4 < the 8 groups the worker asks for
    worker, job = make_worker(servers, engine, loop, tmp_path,
                              pipeline={"max_staleness": 1, "prompts_per_batch": 2, "generations_per_prompt": 2})
    try:
        # the first lease grants 4 of 8 with slow_down; dropping them would hold the backlog at the bound forever
        assert run_until(worker, loop, lambda: store.snapshot(job).written >= 4)
        s = store.snapshot(job)
        assert s.lost_lease == 0 and s.leases_expired == 0
    finally:
        worker.weights.close()


def test_leases_of_long_generations_are_renewed(servers, engine, loop, tmp_path):
    store = servers[2]
    worker, job = make_worker(servers, engine, loop, tmp_path, data={"lease_seconds": 0.6},
                              pipeline={"max_staleness": 100, "prompts_per_batch": 2, "generations_per_prompt": 2})
    try:
        async def slow_generate(prompt_ids, n, **kwargs):  # the real engine, then 2 s: 3 lease periods
            out = await engine.generate(prompt_ids, n, **kwargs)
            await asyncio.sleep(2.0)
            return out

        worker.engine = type("SlowEngine", (), {"generate": staticmethod(slow_generate), "alive": True,
                                                 "current_version": 0})()
        assert run_until(worker, loop, lambda: store.snapshot(job).written >= 8)
        s = store.snapshot(job)
        assert s.leases_expired == 0 and s.lost_lease == 0
    finally:
        worker.weights.close()


def test_evaluator_leaves_failed_grades_out_of_the_pass_rate(servers, base_engine, loop, tmp_path, states):
    worker, job = make_worker(servers, base_engine, loop, tmp_path,
                              validation={"num_prompts": 4, "samples_per_prompt": 2})
    try:
        version = base_engine.current_version + 1
        worker.weights.publish(job, version, states[0], pinned=True)
        prompts = build_prompts(worker.recipe.task, "validation")
        good = prompts[:2]
        bad = [dataclasses.replace(p, task="no-such-task") for p in prompts[2:4]]  # the grader fails on these
        worker._validation_prompts[""] = good + bad
        resp = loop.run(worker.evaluate(version, 4, 2))
        assert (resp.completions_graded, resp.completions_failed_to_grade) == (4, 4)
        worker._validation_prompts[""] = bad
        worker.weights.publish(job, version + 1, states[0], pinned=True)
        with pytest.raises(errors.Unavailable, match="failed to grade"):
            loop.run(worker.evaluate(version + 1, 2, 2))
    finally:
        worker.weights.close()


def test_evaluator_evaluates_a_downstream_sets_own_task(servers, base_engine, loop, tmp_path, states):
    """An eval set names another task: its validation prompts (built from that task's own defaults) are what the
    pinned version is evaluated on, not the job's."""
    worker, job = make_worker(servers, base_engine, loop, tmp_path,
                              task={"num_train_prompts": 64, "difficulty": {"4": 1.0}},
                              validation={"num_prompts": 100, "eval_sets": [{"task": "arithmetic", "name": "arith"}]})
    try:
        version = base_engine.current_version + 1
        worker.weights.publish(job, version, states[0], pinned=True)
        own = worker.validation_prompts("", 3)
        downstream = worker.validation_prompts("arith", 3)
        assert len(downstream) == 3 and [p.text for p in downstream] != [p.text for p in own]
        resp = loop.run(worker.evaluate(version, 3, 1, eval_set="arith"))
        assert (resp.num_prompts, resp.completions_graded) == (3, 3)
        assert worker._validation_prompts["arith"][:3] == downstream
    finally:
        worker.weights.close()


def test_evaluator_evaluates_every_record_of_a_file_set(servers, base_engine, loop, tmp_path, states):
    """A file eval set is the whole file (its records in order, graded by the set's verifier); an eval set the
    recipe does not have is refused naming the field."""
    from scalerl_generator.jobs import Generator

    bench = tmp_path / "bench.jsonl"
    bench.write_text("".join(json.dumps({"q": f"What is {a} + {a}?", "a": str(2 * a)}) + "\n" for a in range(7)))
    worker, job = make_worker(servers, base_engine, loop, tmp_path, validation={"num_prompts": 100, "eval_sets": [
        {"task": "file", "name": "doubles", "num_prompts": 20, "verifier": "exact_numeric",
         "dataset": {"path": str(bench), "prompt_field": "q", "answer_field": "a"}}]})
    try:
        prompts = worker.validation_prompts("doubles", 20)
        assert [(p.text, p.answer, p.task) for p in prompts] == [
            (f"What is {a} + {a}?", str(2 * a), "exact_numeric") for a in range(7)]
        version = base_engine.current_version + 1
        worker.weights.publish(job, version, states[0], pinned=True)
        resp = loop.run(worker.evaluate(version, 20, 1, eval_set="doubles"))
        assert (resp.num_prompts, resp.completions_graded) == (7, 7)
        generator = Generator("evaluator-1", "evaluator")
        generator.worker = worker
        with pytest.raises(errors.InvalidArgument, match="no eval set 'nope' .its sets: doubles.") as err:
            generator.evaluate(job, version, 2, 1, eval_set="nope")
        assert err.value.field == "eval_set"
    finally:
        worker.weights.close()
