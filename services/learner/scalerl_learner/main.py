"""Learner process: waits for the active job, runs it, reports status over gRPC."""

from __future__ import annotations

import logging
import threading
import traceback

import torch

from scalerl.control import ControlPlaneClient
from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl.v1 import learner_pb2, learner_pb2_grpc
from scalerl_learner.runner import JobCancelled, JobRunner

log = logging.getLogger(__name__)


class LearnerService(learner_pb2_grpc.LearnerServicer):
    def __init__(self):
        self.runner: JobRunner | None = None

    def GetStatus(self, request, context):
        r = self.runner
        if r is None:
            return learner_pb2.LearnerStatus(phase="idle")
        return learner_pb2.LearnerStatus(job_id=r.job_id, step=r.step, policy_version=r.version,
                                         phase=r.status, compute=r.compute_split())


def work_loop(settings: Settings, service: LearnerService, stop: threading.Event) -> None:
    control = ControlPlaneClient(settings.control_plane_addr, "learner")
    while not stop.is_set():
        job = control.wait_for_job(stop, settings.poll_interval_s)
        if job is None:
            return
        runner = service.runner = JobRunner(settings, job, control, stop)
        try:
            runner.run()
        except JobCancelled as err:
            log.info("job %s: %s", job.job_id, err)
        except Exception as err:
            log.exception("job %s failed", job.job_id)
            if not stop.is_set():
                try:
                    control.finish(job.job_id, "failed", f"learner: {type(err).__name__}: {err}\n"
                                   f"{traceback.format_exc(limit=3)}")
                except Exception:
                    log.exception("could not report the failure")
        finally:
            runner.close()
            service.runner = None


def main(settings: Settings) -> None:
    torch.set_num_threads(settings.torch_threads)
    service = LearnerService()
    registration = ServiceRegistration(["scalerl.v1.Learner"],
                                       lambda s: learner_pb2_grpc.add_LearnerServicer_to_server(service, s))
    run_service(settings, registration, background=lambda stop: work_loop(settings, service, stop))
