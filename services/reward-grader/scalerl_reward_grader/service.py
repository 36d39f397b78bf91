"""RewardGrader gRPC servicer: decode the items, grade them (`grading.Grader`), encode the results."""

from __future__ import annotations

import grpc

from scalerl.v1 import common_pb2, reward_grader_pb2, reward_grader_pb2_grpc
from scalerl_reward_grader.grading import Grade, Grader, Item


def encode(grade: Grade) -> reward_grader_pb2.GradeResult:
    if grade.reward is None:
        return reward_grader_pb2.GradeResult(status=common_pb2.GRADE_STATUS_FAILED, error=grade.error)
    return reward_grader_pb2.GradeResult(reward=grade.reward, status=common_pb2.GRADE_STATUS_GRADED)


class RewardGraderService(reward_grader_pb2_grpc.RewardGraderServicer):
    def __init__(self, grader: Grader):
        self.grader = grader

    def Grade(self, request, context):
        items = [Item(i.task, i.answer, i.response, i.metadata_json) for i in request.items]
        grades = self.grader.grade(request.job_id, items, request.timeout_s)
        return reward_grader_pb2.GradeResponse(results=[encode(g) for g in grades])


def add_to_server(server: grpc.Server, grader: Grader) -> RewardGraderService:
    service = RewardGraderService(grader)
    reward_grader_pb2_grpc.add_RewardGraderServicer_to_server(service, server)
    return service
