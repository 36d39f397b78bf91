"""FSDP2 on CPU with gloo, launched by torchrun: 2 ranks train 5 steps to the parameters a single process
reaches (<= 1e-5 relative), and a torch.distributed.checkpoint written by 2 ranks resumes on 1 rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from scalerl.models import build_tiny_model
from scalerl.ports import unused_port
from scalerl.recipe import Recipe
from scalerl_learner.fsdp_run import parse_args, synthetic_groups
from scalerl_learner.trainer import Trainer

pytestmark = pytest.mark.distributed

RECIPE = {"optimizer": {"lr": 1e-3, "warmup_steps": 3}, "learner": {"micro_batch_tokens": 80}}  # 5 or 4 micro-batches


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", sft_steps=5)


def torchrun(nproc: int, model_dir: Path, out: Path, *extra: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={unused_port()}", "-m", "scalerl_learner.fsdp_run", "--model", str(model_dir),
           "--out", str(out), "--recipe-json", json.dumps(RECIPE), *extra]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "result.json").read_text())


def single_process(model_dir: Path, steps: int):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    trainer = Trainer(model, Recipe.model_validate(RECIPE), pad_id=0)
    args = parse_args(["--model", "x", "--out", "x"])
    stats = [trainer.step(synthetic_groups(step, args.prompts, args.per_prompt, args.completion_tokens,
                                           model.config.vocab_size), 0) for step in range(steps)]
    return model, [(s["loss"], s["grad_norm"]) for s in stats]


def same_steps(got: list[dict], ref: list[tuple[float, float]]) -> bool:
    """Same loss and pre-clip gradient norm at every step (the norm catches a gradient scaled by the ranks,
    which Adam's update alone would hide)."""
    return [(s["loss"], s["grad_norm"]) for s in got] == [pytest.approx(r, rel=1e-5, abs=1e-8) for r in ref]


def assert_same_parameters(model, path: Path) -> None:
    got = load_file(str(path))
    ref = model.state_dict()
    assert set(got) == set(ref)
    for name, t in ref.items():
        err = (got[name] - t).norm() / t.norm().clamp(min=1e-30)
        assert err <= 1e-5, (name, err.item())


def test_two_gloo_ranks_match_one_process_and_resume_on_one_rank(model_dir, tmp_path):
    ref_model, ref_steps = single_process(model_dir, 5)

    two = torchrun(2, model_dir, tmp_path / "two", "--steps", "5")
    assert two["world_size"] == 2
    assert any(s["micro_batches"] % 2 for s in two["steps"])  # a rank ran a zero-weight pass to stay in step
    assert same_steps(two["steps"], ref_steps)
    assert_same_parameters(ref_model, tmp_path / "two" / "model.safetensors")

    # 3 steps on 2 ranks, checkpoint (DCP), then the last 2 steps on 1 rank from it: the same end point.
    torchrun(2, model_dir, tmp_path / "first", "--steps", "3")
    one = torchrun(1, model_dir, tmp_path / "rest", "--steps", "2", "--first-step", "3",
                   "--load", str(tmp_path / "first" / "dcp"))
    assert one["world_size"] == 1
    assert same_steps(one["steps"], ref_steps[3:])
    assert_same_parameters(ref_model, tmp_path / "rest" / "model.safetensors")
