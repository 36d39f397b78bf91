"""Reward grader: the verifiers directly and the RewardGrader service through a real gRPC server."""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures

import grpc
import pytest
import reasoning_gym
from prometheus_client import REGISTRY

from scalerl.serving import GRPC_OPTIONS
from scalerl.v1 import common_pb2
from scalerl.v1 import reward_grader_pb2 as pb
from scalerl.v1 import reward_grader_pb2_grpc as pb_grpc
from scalerl_grader import verifiers
from scalerl_grader.service import RewardGraderService
from scalerl_grader.verifiers import exact_numeric, get_verifier, math_answer

GRADED = common_pb2.GRADE_STATUS_GRADED
FAILED = common_pb2.GRADE_STATUS_FAILED


@pytest.fixture(scope="module")
def grader():
    service = RewardGraderService(default_timeout_s=10.0, workers=8)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=GRPC_OPTIONS)
    pb_grpc.add_RewardGraderServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    assert port
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=GRPC_OPTIONS)
    yield pb_grpc.RewardGraderStub(channel)
    channel.close()
    server.stop(0).wait()
    service.pool.shutdown(wait=False, cancel_futures=True)


def grade(stub, *items, timeout_s: float = 0.0, job_id: str = "job-grader"):
    request = pb.GradeRequest(job_id=job_id, timeout_s=timeout_s,
                              items=[pb.GradeItem(**item) for item in items])
    return stub.Grade(request, timeout=30).results


def rg_entry(index: int = 0) -> tuple[str, dict]:
    ds = reasoning_gym.create_dataset("basic_arithmetic", size=2, seed=1)
    return "basic_arithmetic", ds[index]


# ---------------------------------------------------------------------------------------------- exact_numeric


@pytest.mark.parametrize("response,answer,expected", [
    ("The answer is 42", "42", 1.0),
    ("<think>maybe 41, or 40</think> so 42", "42", 1.0),
    ("<think>it is 42</think> the answer is 41", "42", 0.0),  # only the text after </think> counts
    ("first 7 then 12 and finally 42", "42", 1.0),  # the last integer
    ("42 was wrong, it is 43", "42", 0.0),
    ("-17", "-17", 1.0),
    ("it equals -17.", " -17 ", 1.0),
    ("17", "-17", 0.0),
    ("no number here", "3", 0.0),
    ("<think>3</think>", "3", 0.0),  # nothing after the reasoning
    ("", "0", 0.0),
])
def test_exact_numeric(response, answer, expected):
    assert exact_numeric(response, answer, {}) == expected


def test_exact_numeric_unparsable_reference_raises():
    with pytest.raises(ValueError):
        exact_numeric("3", "three", {})


# ---------------------------------------------------------------------------------------------- math


@pytest.mark.parametrize("response,answer,expected", [
    ("so the result is \\boxed{1/2}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\frac{2}{4}}", "$\\frac{1}{2}$", 1.0),
    ("<think>\\boxed{3}</think> the answer is $\\frac{1}{2}$", "0.5", 1.0),
    ("<think>\\boxed{0.5}</think> \\boxed{3}", "0.5", 0.0),
    ("\\boxed{3}", "0.5", 0.0),
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
])
def test_math_verifier(response, answer, expected):
    assert math_answer(response, answer, {}) == expected


def test_math_verifier_works_off_the_main_thread():
    """The service runs verifiers on worker threads: math-verify's signal-based timeouts must not be used."""
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", math_answer("\\boxed{1/2}", "0.5", {})))
    t.start()
    t.join(30)
    assert out == {"r": 1.0}


# ---------------------------------------------------------------------------------------------- registry


def test_get_verifier_routes_tasks():
    assert get_verifier("exact_numeric") is verifiers.exact_numeric
    assert get_verifier("math") is verifiers.math_answer
    assert get_verifier("reasoning_gym/basic_arithmetic") is verifiers.reasoning_gym
    with pytest.raises(KeyError, match="nope"):
        get_verifier("nope")


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
    release = threading.Event()

    def slow(response, answer, metadata):
        release.wait(5)
        return 1.0

    monkeypatch.setitem(verifiers.VERIFIERS, "slow", slow)
    job = "job-timeout"
    try:
        t0 = time.monotonic()
        results = grade(grader,
                        dict(task="slow", answer="1", response="1"),
                        dict(task="exact_numeric", answer="1", response="1"),
                        timeout_s=0.3, job_id=job)
        elapsed = time.monotonic() - t0
    finally:
        release.set()
    assert results[0].status == FAILED
    assert "timed out" in results[0].error
    assert (results[1].status, results[1].reward) == (GRADED, 1.0)
    assert elapsed < 3
    assert REGISTRY.get_sample_value("scalerl_grader_items_total",
                                     {"job_id": job, "task": "slow", "status": "failed"}) == 1
    assert REGISTRY.get_sample_value("scalerl_grader_items_total",
                                     {"job_id": job, "task": "exact_numeric", "status": "graded"}) == 1


def test_default_timeout_applies_when_zero(grader, monkeypatch):
    monkeypatch.setitem(verifiers.VERIFIERS, "quick", lambda r, a, m: 0.25)
    (result,) = grade(grader, dict(task="quick", answer="", response=""), timeout_s=0)
    assert (result.status, result.reward) == (GRADED, 0.25)


def test_negative_timeout_is_invalid_argument(grader):
    with pytest.raises(grpc.RpcError) as err:
        grade(grader, dict(task="exact_numeric", answer="1", response="1"), timeout_s=-1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "timeout_s" in err.value.details()


def test_empty_batch(grader):
    assert list(grade(grader)) == []
