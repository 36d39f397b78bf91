"""HF-format checkpoints with the trainer state beside them; resume keeps policy versions monotone."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TRAINER_STATE = "trainer_state.pt"
META = "scalerl_checkpoint.json"


@dataclass
class ResumeState:
    path: Path
    step: int
    policy_version: int
    learner_device_seconds: float


def save_checkpoint(root: Path, model, tokenizer, optimizer, scheduler, *, step: int, policy_version: int,
                    learner_device_seconds: float, keep: int = 2) -> Path:
    def write_payload(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                    "python_rng": random.getstate()}, tmp / TRAINER_STATE)

    return write_checkpoint(root, write_payload, step=step, policy_version=policy_version,
                            learner_device_seconds=learner_device_seconds, keep=keep)


def write_checkpoint(root: Path, write_payload: Callable[[Path], None], *, step: int, policy_version: int,
                     learner_device_seconds: float, keep: int = 2, **extra_meta) -> Path:
    """`write_payload(tmp)` fills a temporary directory, which gets the meta file (plus `extra_meta`) and is
    renamed into place; only the newest `keep` checkpoints stay."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".tmp-step-{step:08d}"
    shutil.rmtree(tmp, ignore_errors=True)
    write_payload(tmp)
    (tmp / META).write_text(json.dumps({"step": step, "policy_version": policy_version,
                                        "learner_device_seconds": learner_device_seconds, **extra_meta}))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)  # a checkpoint is either complete or absent
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(root: Path) -> ResumeState | None:
    for path in sorted(root.glob("step-*"), reverse=True):
        meta = path / META
        if meta.exists():
            data = json.loads(meta.read_text())
            return ResumeState(path, data["step"], data["policy_version"], data.get("learner_device_seconds", 0.0))
    return None


def restore_trainer_state(path: Path, optimizer, scheduler) -> None:
    state = torch.load(path / TRAINER_STATE, weights_only=False)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])
