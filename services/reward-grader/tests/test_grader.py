"""The RewardGrader service through a real gRPC server (the verifiers themselves: shared/tests/test_tasks.py)."""

from __future__ import annotations

import json
import os
import time

import grpc
import pytest
import reasoning_gym
from prometheus_client import REGISTRY

from scalerl.serving import ServiceRegistration, channel, start_server
from scalerl.tasks import VERIFIERS, Verifier
from scalerl.v1 import common_pb2
from scalerl.v1 import reward_grader_pb2 as pb
from scalerl.v1 import reward_grader_pb2_grpc as pb_grpc
from scalerl_reward_grader.grading import Grade, Grader, Item
from scalerl_reward_grader.service import add_to_server

import grader_test_verifiers as test_verifiers

GRADED = common_pb2.GRADE_STATUS_GRADED
FAILED = common_pb2.GRADE_STATUS_FAILED


@pytest.fixture(scope="module")
def grader():
    """The service as `main` wires it: the shared bootstrap's server, with its error interceptor."""
    core = Grader(default_timeout_s=10.0, workers=8)
    running = start_server(ServiceRegistration(["scalerl.v1.RewardGrader"], lambda s: add_to_server(s, core)),
                           host="127.0.0.1", grpc_port=0, metrics_port=None, max_workers=8)
    ch = channel(f"127.0.0.1:{running.grpc_port}")
    yield pb_grpc.RewardGraderStub(ch)
    ch.close()
    running.stop(0)
    core.close()


def grade(stub, *items, timeout_s: float = 0.0, job_id: str = "job-grader"):
    request = pb.GradeRequest(job_id=job_id, timeout_s=timeout_s,
                              items=[pb.GradeItem(**item) for item in items])
    return stub.Grade(request, timeout=30).results


def rg_entry(index: int = 0) -> tuple[str, dict]:
    ds = reasoning_gym.create_dataset("basic_arithmetic", size=2, seed=1)
    return "basic_arithmetic", ds[index]


# ---------------------------------------------------------------------------------------------- service


def test_service_grades_exact_numeric_and_math(grader):
    results = grade(
        grader,
        dict(task="exact_numeric", answer="-4", response="<think>5-3=2, 2-6=-4</think> -4"),
        dict(task="exact_numeric", answer="-4", response="4"),
        dict(task="exact_numeric", answer="7", response="I don't know"),
        dict(task="math", answer="0.5", response="\\boxed{1/2}"),
        dict(task="math", answer="0.5", response="\\boxed{2}"),
    )
    assert [r.status for r in results] == [GRADED] * 5
    assert [r.reward for r in results] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert all(r.error == "" for r in results)


def test_service_grades_reasoning_gym_entries(grader):
    name, entry = rg_entry(0)
    meta = json.dumps({"dataset": name, "entry": entry})
    wrong = str(int(entry["answer"]) + 1)
    results = grade(
        grader,
        dict(task=f"reasoning_gym/{name}", answer=entry["answer"], response=entry["answer"], metadata_json=meta),
        dict(task=f"reasoning_gym/{name}", answer=entry["answer"],
             response=f"<think>hmm {wrong}</think>{entry['answer']}", metadata_json=meta),
        dict(task=f"reasoning_gym/{name}", answer=entry["answer"], response=wrong, metadata_json=meta),
    )
    assert [r.status for r in results] == [GRADED] * 3
    assert [r.reward for r in results] == [1.0, 1.0, 0.0]


def test_service_reasoning_gym_without_metadata_fails(grader):
    (result,) = grade(grader, dict(task="reasoning_gym/basic_arithmetic", answer="1", response="1"))
    assert result.status == FAILED
    assert "metadata_json" in result.error


def test_service_bad_metadata_json_fails(grader):
    (result,) = grade(grader, dict(task="reasoning_gym/basic_arithmetic", answer="1", response="1",
                                   metadata_json="{not json"))
    assert result.status == FAILED and "JSONDecodeError" in result.error


def test_unknown_task_fails_naming_the_task(grader):
    results = grade(grader,
                    dict(task="astrology", answer="1", response="1"),
                    dict(task="exact_numeric", answer="1", response="1"))
    assert results[0].status == FAILED
    assert "astrology" in results[0].error
    assert results[0].reward == 0.0
    assert (results[1].status, results[1].reward) == (GRADED, 1.0)  # one bad item does not fail the batch


def test_verifier_exception_is_failed_not_zero(grader):
    (result,) = grade(grader, dict(task="exact_numeric", answer="not-an-int", response="3"))
    assert result.status == FAILED
    assert "ValueError" in result.error


def test_timeout_marks_item_failed_not_zero(grader, monkeypatch):
    monkeypatch.setitem(VERIFIERS, "slow", Verifier("slow", test_verifiers.slow))
    job = "job-timeout"
    t0 = time.monotonic()
    results = grade(grader,
                    dict(task="slow", answer="1", response="1"),
                    dict(task="exact_numeric", answer="1", response="1"),
                    timeout_s=0.3, job_id=job)
    elapsed = time.monotonic() - t0
    assert results[0].status == FAILED
    assert "timed out" in results[0].error
    assert (results[1].status, results[1].reward) == (GRADED, 1.0)
    assert elapsed < 3
    assert REGISTRY.get_sample_value("scalerl_grader_items_total",
                                     {"job_id": job, "task": "slow", "status": "failed"}) == 1
    assert REGISTRY.get_sample_value("scalerl_grader_items_total",
                                     {"job_id": job, "task": "exact_numeric", "status": "graded"}) == 1


def test_default_timeout_applies_when_zero(grader, monkeypatch):
    monkeypatch.setitem(VERIFIERS, "quick", Verifier("quick", test_verifiers.quick))
    (result,) = grade(grader, dict(task="quick", answer="", response=""), timeout_s=0)
    assert (result.status, result.reward) == (GRADED, 0.25)


def test_negative_timeout_is_invalid_argument(grader):
    with pytest.raises(grpc.RpcError) as err:
        grade(grader, dict(task="exact_numeric", answer="1", response="1"), timeout_s=-1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_s" in err.value.details()


def test_empty_batch(grader):
    assert list(grade(grader)) == []


def test_verifier_without_its_package_fails_naming_it(grader, monkeypatch):
    monkeypatch.setitem(VERIFIERS, "needs-pkg",
                        Verifier("needs-pkg", test_verifiers.needs_pkg, packages=("scalerl_no_such_package",)))
    (result,) = grade(grader, dict(task="needs-pkg", answer="1", response="1"))
    assert result.status == FAILED
    assert "MissingPackages" in result.error and "scalerl_no_such_package" in result.error


# ---------------------------------------------------------------------------------------------- verifier pool


def test_a_hung_verifier_is_abandoned_and_its_worker_replaced():
    """One verifier process: an item that never ends is failed at its timeout, its process killed, and the next
    item is graded by a fresh process (a thread pool would keep its only thread in the hung verifier forever)."""
    core = Grader(default_timeout_s=30.0, workers=1)
    try:
        (worker,) = core.grade("job-hang", [Item("test_pid", "", "")])
        hung = core.grade("job-hang", [Item("test_hang", "1", "1")], timeout_s=0.5)
        assert hung[0].reward is None and "timed out" in hung[0].error
        graded = core.grade("job-hang", [Item("exact_numeric", "1", "1")], timeout_s=10)
        assert graded == [Grade(1.0)]
        assert not pid_alive(int(worker.reward))  # the hung verifier's process is gone, not left running
        for _ in range(2):  # again: each hang costs one process, never one more
            assert "timed out" in core.grade("job-hang", [Item("test_hang", "1", "1")], timeout_s=0.5)[0].error
        assert core.grade("job-hang", [Item("exact_numeric", "1", "1")]) == [Grade(1.0)]
        assert len(core.pool.processes) == 1
        assert REGISTRY.get_sample_value("scalerl_grader_verifier_restarts_total") >= 3
    finally:
        core.close()


def test_a_requests_items_are_verified_concurrently(tmp_path):
    """Four items that each wait until all four are being verified at once: one at a time, each scores 0."""
    core = Grader(default_timeout_s=30.0, workers=4)
    try:
        meta = json.dumps({"dir": str(tmp_path), "n": 4})
        grades = core.grade("job-concurrent", [Item("test_rendezvous", "1", str(i), meta) for i in range(4)])
        assert grades == [Grade(1.0)] * 4
    finally:
        core.close()


def test_a_verifier_that_cannot_travel_to_a_worker_fails_its_item(monkeypatch):
    monkeypatch.setitem(VERIFIERS, "closure", Verifier("closure", lambda r, a, m: 1.0))
    core = Grader(workers=1)
    try:
        (result,) = core.grade("job-closure", [Item("closure", "1", "1")])
        assert result.reward is None and "pickle" in result.error.lower()
        assert core.grade("job-closure", [Item("exact_numeric", "1", "1")]) == [Grade(1.0)]
    finally:
        core.close()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
