"""Versions queued for validation, kept on disk beside the checkpoints until their point is on the curve: a
restarted learner validates what its predecessor queued, and re-publishes a queued version's weights when the
transport no longer holds them (the evaluator released them and died, or weight-broadcast restarted)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from scalerl.recipe import ValidationConfig
from scalerl.v1 import common_pb2
from scalerl.weights.base import NamedTensors
from scalerl.weights.codec import SafetensorsFile, StagingBuffers


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of a queued version: its point goes to the forecaster's curve `eval_set`."""

    eval_set: str
    """"" for the iid validation split (AddPointRequest.eval_set, EvaluateRequest.eval_set), else the downstream
    set's name."""
    num_prompts: int
    samples_per_prompt: int


def evaluations(validation: ValidationConfig) -> list[Evaluation]:
    """What each queued version is evaluated on, all on the same pinned version: the iid validation split first,
    then every downstream eval set of the recipe, in its order."""
    return [Evaluation("", validation.num_prompts, validation.samples_per_prompt)] + [
        Evaluation(s.set_name, s.num_prompts, s.samples_per_prompt) for s in validation.eval_sets]


@dataclass(frozen=True)
class QueuedValidation:
    version: int
    step: int
    split: common_pb2.ComputeSplit
    """Compute spent when `version` was published (the point's x-axis)."""


class ValidationQueue:
    """One `v<version>.json` per queued validation (state `queued` or `done`) and, while queued, the version's
    weights in `v<version>.safetensors`."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._staging = StagingBuffers(count=1)  # GPU weights: one page-locked copy, reused per validation

    def _meta(self, version: int) -> Path:
        return self.root / f"v{version:08d}.json"

    def weights_path(self, version: int) -> Path:
        return self.root / f"v{version:08d}.safetensors"

    def _records(self) -> list[dict]:
        records = []
        for path in sorted(self.root.glob("v*.json")):
            try:
                records.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # a record is written by rename: a broken one is foreign
        return records

    def _write(self, version: int, record: dict) -> None:
        tmp = self.root / f".v{version:08d}.json.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self._meta(version))

    def add(self, version: int, step: int, split: common_pb2.ComputeSplit, tensors: NamedTensors) -> QueuedValidation:
        """Queue `version` (weights first, then the record: a record always has its weights)."""
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = self.root / f".v{version:08d}.safetensors.tmp"
            with self._staging.encoded(tensors) as blob:
                tmp.write_bytes(blob)
            os.replace(tmp, self.weights_path(version))
            self._write(version, {"version": version, "step": step, "state": "queued",
                                  "split": split.SerializeToString().hex()})
        return QueuedValidation(version, step, split)

    def queued(self) -> list[QueuedValidation]:
        """Validations not yet on the curve, oldest first."""
        with self._lock:
            return [QueuedValidation(r["version"], r["step"],
                                     common_pb2.ComputeSplit.FromString(bytes.fromhex(r["split"])))
                    for r in self._records() if r["state"] == "queued"]

    def steps(self) -> set[int]:
        """Steps with a validation queued or done (a step retrained after a resume is not validated twice)."""
        with self._lock:
            return {r["step"] for r in self._records()}

    def weights(self, job_id: str, version: int) -> SafetensorsFile:
        return SafetensorsFile(job_id, version, str(self.weights_path(version)))

    def done(self, version: int) -> None:
        with self._lock:
            record = json.loads(self._meta(version).read_text())
            record["state"] = "done"
            self._write(version, record)
            self.weights_path(version).unlink(missing_ok=True)
