"""The Learner gRPC servicer: reports what the job runner is doing."""

from __future__ import annotations

from scalerl.v1 import learner_pb2, learner_pb2_grpc
from scalerl_learner.runner import JobRunner


class LearnerService(learner_pb2_grpc.LearnerServicer):
    def __init__(self):
        self.runner: JobRunner | None = None
        """The job being run; None while idle (set by the work loop)."""

    def GetStatus(self, request, context):
        r = self.runner
        if r is None:
            return learner_pb2.LearnerStatus(phase="idle")
        return learner_pb2.LearnerStatus(job_id=r.job_id, step=r.step, policy_version=r.version,
                                         phase=r.status, compute=r.compute_split())
