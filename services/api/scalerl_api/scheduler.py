"""The scheduler: starts the oldest queued job when none runs, once its prompt pool is ready."""

from __future__ import annotations

import logging
import threading

from sqlalchemy.orm import sessionmaker

from scalerl.logs import job_logger
from scalerl_api import crud, metrics
from scalerl_api.backends import BackendError, Backends
from scalerl_api.models import JobState

log = logging.getLogger(__name__)


class Scheduler:
    """Starts the oldest queued job when none runs; prepares its prompt pool; fails it if that fails."""

    def __init__(self, sessions: sessionmaker, backends: Backends, interval_s: float = 1.0):
        self.sessions, self.backends, self.interval_s = sessions, backends, interval_s

    def tick(self) -> None:
        with self.sessions() as db:
            for state, n in crud.count_by_state(db).items():
                metrics.JOBS.labels(state).set(n)
            job = crud.next_job_to_start(db)
            if job is None:
                return
            job_log = job_logger(log, job.id)
            try:
                # The prompt pool first: services start on a running job at once and must find it ready.
                pool = self.backends.init_job(job.id, job.recipe_json)
            except BackendError as err:
                crud.finish_job(db, job, JobState.failed, f"replay-buffer could not prepare the job: {err}")
                job_log.error("job failed to start: %s", err)
                return
            if crud.mark_running(db, job) is None:
                job_log.info("job left the queue while its prompt pool was prepared")
                return
            job_log.info("job running (prompt pool %d)", pool)

    def run_until(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # the loop outlives one bad tick (e.g. the database briefly unreachable)
                log.exception("scheduler tick failed")
            stop.wait(self.interval_s)
