"""This generator replica: follows the control plane's active job, runs one JobWorker per job (rollouts, or the
evaluator role's pinned-version evaluations) and answers status and evaluation requests from the servicer."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from scalerl import errors
from scalerl.control import ControlPlaneClient
from scalerl.logs import job_logger
from scalerl.settings import Settings
from scalerl.v1 import generator_pb2
from scalerl_generator import metrics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GeneratorState:
    generator_id: str
    role: str
    job_id: str = ""
    policy_version: int = 0
    groups_in_flight: int = 0
    tokens_generated: int = 0


class Generator:
    def __init__(self, generator_id: str, role: str):
        self.generator_id, self.role = generator_id, role
        self.worker = None  # the JobWorker while a job runs
        self.eval_lock = threading.Lock()

    def state(self) -> GeneratorState:
        w = self.worker
        if w is None or w.engine is None:
            return GeneratorState(self.generator_id, self.role)
        return GeneratorState(self.generator_id, self.role, w.job_id, w.engine.current_version,
                              len(w.in_flight_versions), w.tokens)

    def evaluate(self, job_id: str, policy_version: int, num_prompts: int, samples_per_prompt: int,
                 eval_set: str = "") -> generator_pb2.EvaluateResponse:
        """Pass rate of exactly `policy_version` on the held-out split of the job's task, or on a downstream eval
        set of its recipe (by name); blocks until done."""
        if self.role != "evaluator":
            raise errors.FailedPrecondition("this generator is not in the evaluator role", job_id=job_id)
        if num_prompts <= 0:
            raise errors.InvalidArgument("must be > 0", field="num_prompts", job_id=job_id)
        if samples_per_prompt <= 0:
            raise errors.InvalidArgument("must be > 0", field="samples_per_prompt", job_id=job_id)
        w = self.worker
        if w is None or w.engine is None or w.job_id != job_id:
            raise errors.Unavailable(f"not serving job {job_id!r} yet", field="job_id", job_id=job_id)
        if eval_set and w.eval_set(eval_set) is None:
            names = ", ".join(s.set_name for s in w.recipe.validation.eval_sets) or "none"
            raise errors.InvalidArgument(f"job has no eval set {eval_set!r} (its sets: {names})", field="eval_set",
                                         job_id=job_id)
        with self.eval_lock:  # one pinned version at a time
            future = asyncio.run_coroutine_threadsafe(
                w.evaluate(policy_version, num_prompts, samples_per_prompt, eval_set), w.loop)
            return future.result()


async def watch_job(control: ControlPlaneClient, job_id: str, poll_s: float, stop: threading.Event,
                    engine_alive: Callable[[], bool], rpc_timeout_s: float = 5.0) -> None:
    """Return once the control plane answers that `job_id` is no longer the active job (or `stop` is set).
    An unreachable control plane keeps the job running; a dead engine raises."""
    while not stop.is_set():
        await asyncio.sleep(poll_s)
        if not engine_alive():
            raise RuntimeError("the engine stopped")
        if not await asyncio.to_thread(control.still_active, job_id, rpc_timeout_s):
            return


async def run_job(settings: Settings, job, generator: Generator, stop: threading.Event,
                  control: ControlPlaneClient) -> None:
    from scalerl_generator.worker import JobWorker

    jlog = job_logger(log, job.job_id)
    job_stop = threading.Event()
    worker = JobWorker(settings, job, job_stop, generator.generator_id)
    await worker.start_engine()
    generator.worker = worker
    jlog.info("%s engine ready", generator.role)

    async def watch() -> None:
        await watch_job(control, job.job_id, settings.poll_interval_s, stop, lambda: worker.engine.alive)
        job_stop.set()

    watcher = asyncio.create_task(watch())
    try:
        if generator.role == "rollout":
            metrics.start_job(job.job_id, generator.generator_id)
            subscriber = threading.Thread(target=worker.subscribe_weights, name="weights", daemon=True)
            subscriber.start()
            await worker.rollout_loop(settings.max_groups_in_flight)
        else:
            await watcher
    finally:
        job_stop.set()
        watcher.cancel()
        generator.worker = None
        await worker.close()
        metrics.forget_job(job.job_id)
        jlog.info("%s stopped", generator.role)


def work_loop(settings: Settings, generator: Generator, stop: threading.Event) -> None:
    control = ControlPlaneClient(settings.control_plane_addr, generator.generator_id)
    while not stop.is_set():
        job = control.wait_for_job(stop, settings.poll_interval_s)
        if job is None:
            return
        try:
            asyncio.run(run_job(settings, job, generator, stop, control))
        except Exception:
            job_logger(log, job.job_id).exception("generator failed; retrying")
            stop.wait(5)
