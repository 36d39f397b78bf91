"""The ControlPlane gRPC servicer: decodes each request, calls `JobLifecycle`, encodes its answer."""

from __future__ import annotations

from scalerl.v1 import common_pb2, control_plane_pb2, control_plane_pb2_grpc
from scalerl_api.lifecycle import JobLifecycle, Progress


class ControlPlaneService(control_plane_pb2_grpc.ControlPlaneServicer):
    def __init__(self, lifecycle: JobLifecycle):
        self.lifecycle = lifecycle

    def GetActiveJob(self, request, context):
        job = self.lifecycle.active_job()
        if job is None:
            return control_plane_pb2.ActiveJob()
        return control_plane_pb2.ActiveJob(job=common_pb2.Job(job_id=job.job_id, recipe_json=job.recipe_json,
                                                              state=job.state))

    def ReportProgress(self, request, context):
        c = request.compute
        progress = Progress(step=request.step, policy_version=request.policy_version,
                            learner_device_hours=c.learner_device_hours,
                            generator_device_hours=c.generator_device_hours,
                            evaluator_device_hours=c.evaluator_device_hours, generated_tokens=c.generated_tokens,
                            last_pass_rate=request.last_pass_rate if request.last_pass_rate >= 0 else None)
        return control_plane_pb2.ReportProgressResponse(
            keep_running=self.lifecycle.report_progress(request.job_id, progress))

    def FinishJob(self, request, context):
        self.lifecycle.finish(request.job_id, request.state, request.reason)
        return control_plane_pb2.FinishJobResponse()
