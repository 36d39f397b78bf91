"""Verifiers for the grader's tests, registered in the `scalerl.tasks` registry. The grader runs verifiers in
worker processes, so they are module-level functions (a worker imports this module to unpickle one)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from scalerl.tasks import VERIFIERS, Verifier, register_verifier


def hang(response: str, answer: str, metadata: dict) -> float:
    """Never answers (a verifier stuck in a pathological input)."""
    while True:
        time.sleep(60)


def slow(response: str, answer: str, metadata: dict) -> float:
    time.sleep(5)
    return 1.0


def quick(response: str, answer: str, metadata: dict) -> float:
    return 0.25


def needs_pkg(response: str, answer: str, metadata: dict) -> float:
    return 1.0


def rendezvous(response: str, answer: str, metadata: dict) -> float:
    """1.0 once `metadata["n"]` items are being verified at the same time (each leaves a file in
    `metadata["dir"]`), 0.0 if they never are within 10 s: items graded one at a time score 0."""
    folder = Path(metadata["dir"])
    (folder / f"{os.getpid()}-{response}").touch()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if len(list(folder.iterdir())) >= metadata["n"]:
            return 1.0
        time.sleep(0.05)
    return 0.0


def pid(response: str, answer: str, metadata: dict) -> float:
    """The worker process's id (a reward only in name): which process verified the item."""
    return float(os.getpid())


for verifier in (Verifier("test_hang", hang), Verifier("test_rendezvous", rendezvous), Verifier("test_pid", pid)):
    if verifier.name not in VERIFIERS:
        register_verifier(verifier)
