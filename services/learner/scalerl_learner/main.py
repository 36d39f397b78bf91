"""Learner process: waits for the active job, runs it, reports status over gRPC."""

from __future__ import annotations

import logging
import threading
import traceback

import torch

from scalerl.control import ControlPlaneClient, ControlPlaneUnavailable
from scalerl.logs import job_logger
from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl.v1 import learner_pb2_grpc
from scalerl_learner import metrics
from scalerl_learner.runner import JobCancelled, JobRunner
from scalerl_learner.service import LearnerService

log = logging.getLogger(__name__)


def work_loop(settings: Settings, service: LearnerService, stop: threading.Event,
              runner_cls: type[JobRunner] = JobRunner) -> None:
    control = ControlPlaneClient(settings.control_plane_addr, "learner")
    while not stop.is_set():
        job = control.wait_for_job(stop, settings.poll_interval_s)
        if job is None:
            return
        job_log = job_logger(log, job.job_id)
        runner = service.runner = runner_cls(settings, job, control, stop)
        try:
            runner.run()
        except JobCancelled as err:
            job_log.info("stopped: %s", err)
        except ControlPlaneUnavailable as err:
            # Nothing can be reported now; the job is still running for the control plane, so the next
            # wait_for_job resumes it from its checkpoint (a job whose budget was reached only finishes).
            job_log.warning("%s", err)
        except runner_cls.FATAL:  # the process must go (e.g. a rank of the group is lost); the job is not failed
            raise
        except Exception as err:  # the job fails, the learner stays up for the next one
            job_log.exception("job failed")
            if not stop.is_set():
                try:
                    control.finish(job.job_id, "failed", f"learner: {type(err).__name__}: {err}\n"
                                   f"{traceback.format_exc(limit=3)}")
                except Exception:
                    job_log.exception("could not report the failure")
        finally:
            runner.close()
            service.runner = None
            metrics.forget_job(job.job_id)


def main(settings: Settings) -> None:
    torch.set_num_threads(settings.torch_threads)
    service = LearnerService()
    registration = ServiceRegistration(["scalerl.v1.Learner"],
                                       lambda s: learner_pb2_grpc.add_LearnerServicer_to_server(service, s))
    run_service(settings, registration, background=lambda stop: work_loop(settings, service, stop))
