"""Grading: each item by the verifier it names (the `scalerl.tasks` registry), a request's items concurrently on
a bounded pool of verifier processes (`verifier_pool`), each under a per-item timeout. A verifier that raises or
times out marks its item failed, never reward 0; one bad item does not fail the batch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from scalerl.errors import InvalidArgument
from scalerl.tasks import get_verifier
from scalerl_reward_grader.metrics import GRADED, LATENCY
from scalerl_reward_grader.verifier_pool import VerifierFailed, VerifierPool, VerifierTimeout


@dataclass(frozen=True)
class Item:
    task: str
    """Verifier name (`exact_numeric`, `math`, `reasoning_gym/<dataset>`, ...)."""
    answer: str
    response: str
    metadata_json: str = ""


@dataclass(frozen=True)
class Grade:
    reward: float | None
    """In [0, 1]; None when the item could not be graded."""
    error: str = ""
    """Why the item could not be graded."""


def parse_metadata(metadata_json: str) -> dict:
    return json.loads(metadata_json) if metadata_json else {}


class Grader:
    def __init__(self, default_timeout_s: float = 10.0, workers: int = 4):
        self.default_timeout_s = default_timeout_s
        self.pool = VerifierPool(workers)
        # one waiting thread per verifier process: a request's items go out together, bounded by the pool
        self.dispatch = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grade")

    def grade_item(self, item: Item, timeout_s: float) -> Grade:
        try:
            verifier = get_verifier(item.task)
            metadata = parse_metadata(item.metadata_json)
            return Grade(self.pool.run(verifier, item.response, item.answer, metadata, timeout_s))
        except (VerifierTimeout, VerifierFailed) as err:
            return Grade(None, str(err))
        except Exception as err:  # a broken verifier or input marks the item failed-to-grade
            return Grade(None, f"{type(err).__name__}: {err}")

    def grade(self, job_id: str, items: Sequence[Item], timeout_s: float = 0.0) -> list[Grade]:
        """One grade per item, in order; `timeout_s` 0 means the default."""
        if timeout_s < 0:
            raise InvalidArgument("must be >= 0", field="timeout_s", job_id=job_id)
        timeout = timeout_s or self.default_timeout_s
        with LATENCY.labels(job_id).time():
            grades = list(self.dispatch.map(lambda item: self.grade_item(item, timeout), items))
        for item, grade in zip(items, grades):
            GRADED.labels(job_id, item.task, "failed" if grade.reward is None else "graded").inc()
        return grades

    def close(self) -> None:
        self.pool.close()
        self.dispatch.shutdown(wait=False, cancel_futures=True)
