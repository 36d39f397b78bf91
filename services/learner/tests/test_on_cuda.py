"""The learner on one CUDA GPU (`make gpu-check` on the device machine): a step on CUDA gives the CPU's losses and
gradient norms, and FSDP2 under torchrun joins an NCCL group and trains (every collective sees CUDA tensors)."""

from __future__ import annotations

import pytest
import torch
from test_fsdp_ranks import RECIPE, model_dir, single_process, torchrun  # noqa: F401  (model_dir: a fixture)
from transformers import AutoModelForCausalLM

from scalerl.recipe import Recipe
from scalerl_learner.fsdp_run import parse_args, synthetic_groups
from scalerl_learner.trainer import Trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

STEPS = 3


def close(got: list[dict], ref: list[tuple[float, float]]) -> bool:
    """Same loss and pre-clip gradient norm at every step, to float32 accuracy across devices."""
    return [(s["loss"], s["grad_norm"]) for s in got] == [pytest.approx(r, rel=1e-4, abs=1e-7) for r in ref]


def test_a_step_on_cuda_matches_the_cpu(model_dir):  # noqa: F811
    _, ref = single_process(model_dir, STEPS)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to("cuda")
    model.train()
    trainer = Trainer(model, Recipe.model_validate(RECIPE), pad_id=0, device="cuda")
    args = parse_args(["--model", "x", "--out", "x"])
    got = [trainer.step(synthetic_groups(step, args.prompts, args.per_prompt, args.completion_tokens,
                                         model.config.vocab_size), 0) for step in range(STEPS)]
    assert close(got, ref)


def test_fsdp_on_nccl_trains_as_one_process_does(model_dir, tmp_path):  # noqa: F811
    _, ref = single_process(model_dir, STEPS)
    result = torchrun(1, model_dir, tmp_path / "nccl", "--steps", str(STEPS))
    assert result["device"].startswith("cuda")
    assert close(result["steps"], ref)
