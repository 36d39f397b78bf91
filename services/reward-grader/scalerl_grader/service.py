"""RewardGrader gRPC service: each item graded under a timeout; failures are marked, never scored 0."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout

import grpc
from prometheus_client import Counter, Histogram

from scalerl.v1 import common_pb2, reward_grader_pb2, reward_grader_pb2_grpc
from scalerl_grader.verifiers import get_verifier, parse_metadata

log = logging.getLogger(__name__)

GRADED = Counter("scalerl_grader_items_total", "Graded items by outcome", ["job_id", "task", "status"])
LATENCY = Histogram("scalerl_grader_request_duration_seconds", "Grade request latency", ["job_id"])


class RewardGraderService(reward_grader_pb2_grpc.RewardGraderServicer):
    def __init__(self, default_timeout_s: float = 10.0, workers: int = 8):
        self.default_timeout_s = default_timeout_s
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verifier")

    def grade_item(self, item: reward_grader_pb2.GradeItem, timeout_s: float) -> reward_grader_pb2.GradeResult:
        try:
            verifier = get_verifier(item.task)
            metadata = parse_metadata(item.metadata_json)
            reward = self.pool.submit(verifier, item.response, item.answer, metadata).result(timeout=timeout_s)
            return reward_grader_pb2.GradeResult(reward=float(reward), status=common_pb2.GRADE_STATUS_GRADED)
        except FutureTimeout:
            return reward_grader_pb2.GradeResult(status=common_pb2.GRADE_STATUS_FAILED,
                                                 error=f"verifier timed out after {timeout_s:.1f}s")
        except Exception as err:  # a broken verifier or input marks the item failed-to-grade
            return reward_grader_pb2.GradeResult(status=common_pb2.GRADE_STATUS_FAILED,
                                                 error=f"{type(err).__name__}: {err}")

    def Grade(self, request, context):
        if request.timeout_s < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "timeout_s must be >= 0")
        timeout = request.timeout_s or self.default_timeout_s
        with LATENCY.labels(request.job_id).time():
            results = [self.grade_item(item, timeout) for item in request.items]
        for item, result in zip(request.items, results):
            GRADED.labels(request.job_id, item.task,
                          common_pb2.GradeStatus.Name(result.status).removeprefix("GRADE_STATUS_").lower()).inc()
        return reward_grader_pb2.GradeResponse(results=results)


def main(settings) -> None:
    from scalerl.serving import ServiceRegistration, run_service

    service = RewardGraderService()
    registration = ServiceRegistration(
        ["scalerl.v1.RewardGrader"], lambda s: reward_grader_pb2_grpc.add_RewardGraderServicer_to_server(service, s))
    run_service(settings, registration, on_shutdown=lambda: service.pool.shutdown(wait=False, cancel_futures=True))
