"""Trainer.step with optimizer.adaptive_lr: the step's sampler KL sets the lr of that same step."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from scalerl.recipe import Recipe
from scalerl_learner.trainer import Trainer
from test_micro_batches import model_dir, scored_groups  # noqa: F401  (model_dir: a fixture)


@pytest.mark.parametrize("adaptive, damped", [(None, False), ({"target_sampler_kl": 1e-3}, True),
                                              ({"target_sampler_kl": 1e3}, False)])
def test_a_step_whose_sampler_kl_runs_high_moves_the_weights_by_the_damped_lr(model_dir, adaptive, damped):
    recipe = Recipe(optimizer={"lr": 1e-3, "warmup_steps": 0, "weight_decay": 0.0, "adaptive_lr": adaptive})
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    stats = Trainer(model, recipe, pad_id=0).step(scored_groups(), learner_version=1)
    assert stats["approx_kl"] > 2e-3  # the groups' log-probs are not the model's: far above the low target
    expected = 1e-3 / 1.5 if damped else 1e-3
    assert stats["lr"] == pytest.approx(expected)
    # Adam's first step moves every parameter with a gradient by lr (m / sqrt(v) = ±1, eps 1e-15)
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
    assert moved == pytest.approx(expected, rel=1e-3)
