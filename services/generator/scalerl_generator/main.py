"""Generator process (role rollout or evaluator): follows the control plane's active job."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading

import grpc

from scalerl.control import ControlPlaneClient
from scalerl.serving import ServiceRegistration, run_service
from scalerl.settings import Settings
from scalerl.v1 import generator_pb2, generator_pb2_grpc

log = logging.getLogger(__name__)


class GeneratorService(generator_pb2_grpc.GeneratorServicer):
    def __init__(self, generator_id: str, role: str):
        self.generator_id, self.role = generator_id, role
        self.worker = None
        self.eval_lock = threading.Lock()

    def GetStatus(self, request, context):
        w = self.worker
        status = generator_pb2.GeneratorStatus(generator_id=self.generator_id, role=self.role)
        if w is not None and w.engine is not None:
            status.job_id = w.job_id
            status.policy_version = w.engine.current_version
            status.groups_in_flight = len(w.in_flight_versions)
            status.tokens_generated = w.tokens
        return status

    def Evaluate(self, request, context):
        if self.role != "evaluator":
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this generator is not in the evaluator role")
        if request.num_prompts <= 0 or request.samples_per_prompt <= 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "num_prompts and samples_per_prompt must be > 0")
        w = self.worker
        if w is None or w.engine is None or w.job_id != request.job_id:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"job_id: not serving job {request.job_id!r} yet")
        with self.eval_lock:  # one pinned version at a time
            future = asyncio.run_coroutine_threadsafe(
                w.evaluate(request.policy_version, request.num_prompts, request.samples_per_prompt), w.loop)
            return future.result()


async def run_job(settings: Settings, job, service: GeneratorService, stop: threading.Event,
                  control: ControlPlaneClient) -> None:
    from scalerl_generator.worker import JobWorker

    job_stop = threading.Event()
    worker = JobWorker(settings, job, job_stop, service.generator_id)
    await worker.start_engine()
    service.worker = worker
    log.info("job %s: %s engine ready", job.job_id, service.role)

    async def watch() -> None:
        while not stop.is_set():
            await asyncio.sleep(settings.poll_interval_s)
            if not worker.engine.alive:
                raise RuntimeError(f"job {job.job_id}: the {service.role} engine stopped")
            active = await asyncio.to_thread(control.active_job)
            if active is None or active.job_id != job.job_id:
                break
        job_stop.set()

    watcher = asyncio.create_task(watch())
    try:
        if service.role == "rollout":
            subscriber = threading.Thread(target=worker.subscribe_weights, name="weights", daemon=True)
            subscriber.start()
            await worker.rollout_loop(settings.max_groups_in_flight)
        else:
            await watcher
    finally:
        job_stop.set()
        watcher.cancel()
        service.worker = None
        await worker.close()
        log.info("job %s: %s stopped", job.job_id, service.role)


def work_loop(settings: Settings, service: GeneratorService, stop: threading.Event) -> None:
    control = ControlPlaneClient(settings.control_plane_addr, service.generator_id)
    while not stop.is_set():
        job = control.wait_for_job(stop, settings.poll_interval_s)
        if job is None:
            return
        try:
            asyncio.run(run_job(settings, job, service, stop, control))
        except Exception:
            log.exception("job %s: generator failed; retrying", job.job_id)
            stop.wait(5)


def main(settings: Settings) -> None:
    import torch

    torch.set_num_threads(settings.torch_threads)
    generator_id = settings.generator_id or f"{settings.generator_role}-{socket.gethostname()}-{os.getpid()}"
    service = GeneratorService(generator_id, settings.generator_role)
    registration = ServiceRegistration(["scalerl.v1.Generator"],
                                       lambda s: generator_pb2_grpc.add_GeneratorServicer_to_server(service, s))
    run_service(settings, registration, background=lambda stop: work_loop(settings, service, stop))
