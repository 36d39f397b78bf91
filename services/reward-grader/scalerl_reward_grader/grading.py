"""Grading: each item by the verifier it names (the `scalerl.tasks` registry), on a worker pool under a
per-item timeout. A verifier that raises or times out marks its item failed, never reward 0; one bad item
does not fail the batch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass

from scalerl.errors import InvalidArgument
from scalerl.tasks import get_verifier
from scalerl_reward_grader.metrics import GRADED, LATENCY


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
    def __init__(self, default_timeout_s: float = 10.0, workers: int = 8):
        self.default_timeout_s = default_timeout_s
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verifier")

    def grade_item(self, item: Item, timeout_s: float) -> Grade:
        try:
            verifier = get_verifier(item.task)
            metadata = parse_metadata(item.metadata_json)
            reward = self.pool.submit(verifier, item.response, item.answer, metadata).result(timeout=timeout_s)
            return Grade(float(reward))
        except FutureTimeout:
            return Grade(None, f"verifier timed out after {timeout_s:.1f}s")
        except Exception as err:  # a broken verifier or input marks the item failed-to-grade
            return Grade(None, f"{type(err).__name__}: {err}")

    def grade(self, job_id: str, items: Sequence[Item], timeout_s: float = 0.0) -> list[Grade]:
        """One grade per item, in order; `timeout_s` 0 means the default."""
        if timeout_s < 0:
            raise InvalidArgument("must be >= 0", field="timeout_s", job_id=job_id)
        timeout = timeout_s or self.default_timeout_s
        with LATENCY.labels(job_id).time():
            grades = [self.grade_item(item, timeout) for item in items]
        for item, grade in zip(items, grades):
            GRADED.labels(job_id, item.task, "failed" if grade.reward is None else "graded").inc()
        return grades

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
