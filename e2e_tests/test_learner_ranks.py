"""`make test-distributed`: a job on the local stack whose learner is 2 torchrun ranks (FSDP2 over gloo), as the
chart's learner.distributed runs it. Rank 0 speaks the job protocol, rank 1 trains its share of every batch. Rank 1
is killed (SIGKILL) after a checkpoint: torchrun takes the group down, the supervisor starts a new one, and the
job resumes from its sharded checkpoint and finishes its budget, with the learner's device-hours counting both
ranks."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from e2e_support import running_stack, tiny_recipe, wait_for

pytestmark = pytest.mark.distributed

TOKEN = "ranks-token"
STEPS, CHECKPOINT_EVERY, VALIDATE_EVERY = 40, 4, 20
RECIPE = tiny_recipe(
    # small micro-batches: each rank scores several per step
    learner={"micro_batch_tokens": 256},
    validation={"every_steps": VALIDATE_EVERY, "num_prompts": 8, "samples_per_prompt": 1},
    budget={"max_steps": STEPS, "checkpoint_every_steps": CHECKPOINT_EVERY},
)
ENDED = ("succeeded", "failed", "cancelled")


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """rank -> pid of the workers torchrun started (its children carrying RANK in their environment)."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            env = dict(v.split("=", 1) for v in (entry / "environ").read_bytes().decode(errors="replace")
                       .split("\0") if "=" in v)
        except (OSError, IndexError, ValueError):
            continue
        if "RANK" in env:
            out[int(env["RANK"])] = int(entry.name)
    return out


def problems_since(log_path: Path, offset: int) -> str:
    """What the learner's log says went wrong after `offset`: its warnings and errors, and the exception and exit
    lines of tracebacks (torchrun's included)."""
    with open(log_path, "rb") as f:
        f.seek(offset)
        lines = f.read().decode(errors="replace").splitlines()

    def tells(line: str) -> bool:
        if line.startswith("{"):  # our JSON log records
            return '"level": "warning"' in line or '"level": "error"' in line
        return bool(re.search(r"Error|Exception|exitcode|Signal \d+|already in use", line))

    return "\n".join([line for line in lines if tells(line)][-40:])


def test_rank_killed_mid_job_resumes_from_the_sharded_checkpoint(tmp_path):
    data = tmp_path / "stack"
    with running_stack(data, TOKEN, learner_ranks=2) as (stack, url):
        restarter_stop = threading.Event()

        def restart_crashed() -> None:  # `scalerl up`'s supervisor loop
            while not restarter_stop.wait(0.5):
                stack.poll()

        restarter = threading.Thread(target=restart_crashed, daemon=True)
        restarter.start()
        learner = next(p for p in stack.procs if p.name == "learner")
        try:
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
                job_id = api.post("/v1/jobs", json={"recipe": RECIPE, "name": "ranks"}).json()["id"]
                wait_for(lambda: api.get(f"/v1/jobs/{job_id}").json()["step"] >= CHECKPOINT_EVERY + 1, 600,
                         what="a step past the first checkpoint")
                ckpt_root = data / "checkpoints" / job_id
                first = sorted(ckpt_root.glob("step-*"))
                assert first, "no checkpoint written by the ranks"
                meta = json.loads((first[-1] / "scalerl_checkpoint.json").read_text())
                assert meta["world_size"] == 2 and (first[-1] / "sharded_state" / ".metadata").exists()
                assert (first[-1] / "model.safetensors").exists()  # the HF weights, loadable by transformers

                launcher = learner.proc
                ranks = rank_pids(launcher.pid)
                assert sorted(ranks) == [0, 1], ranks
                log_at_kill = learner.log_path.stat().st_size
                os.kill(ranks[1], signal.SIGKILL)
                launcher.wait(120)  # torchrun stops rank 0 and exits: the group is gone
                assert launcher.returncode != 0
                wait_for(lambda: learner.proc is not launcher and learner.proc.poll() is None, 60,
                         what="the supervisor to start a new learner group")

                final = wait_for(lambda: (j := api.get(f"/v1/jobs/{job_id}").json())["state"] in ENDED and j,
                                 900, what="job to end")
                assert final["state"] == "succeeded", final["reason"]
                assert final["step"] == STEPS
                log = learner.log_path.read_text(errors="replace")
                assert "training on 2 ranks" in log and "resumed from step-" in log
                assert learner.restarts == 1, "a group crashed after the kill:\n" + problems_since(learner.log_path,
                                                                                                log_at_kill)
                curve = api.get(f"/v1/jobs/{job_id}/curve").json()["points"]
                assert [p["policy_version"] for p in curve] == sorted({p["policy_version"] for p in curve})
                assert [p["step"] for p in curve] == [0, VALIDATE_EVERY, STEPS]
        finally:
            restarter_stop.set()
            restarter.join()
