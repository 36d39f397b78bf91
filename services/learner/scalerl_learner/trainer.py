"""One optimizer step of the ScaleRL objective on a batch of scored groups (no I/O: the runner does that)."""

from __future__ import annotations

import math

from scalerl.recipe import Recipe
from scalerl.v1 import common_pb2
from scalerl_learner.batch import build_batch, output_logprobs
from scalerl_learner.losses import compute_advantages, policy_loss
from scalerl_learner.optim import build_optimizer, build_scheduler, clip_grad


class Trainer:
    def __init__(self, model, recipe: Recipe, pad_id: int):
        self.model, self.recipe, self.pad_id = model, recipe, pad_id
        self.optimizer = build_optimizer(model, recipe.optimizer)
        self.scheduler = build_scheduler(self.optimizer, recipe.optimizer)

    def step(self, groups: list[common_pb2.ScoredGroup], learner_version: int) -> dict[str, float]:
        r = self.recipe
        batch = build_batch(groups, self.pad_id)
        new_logprobs = output_logprobs(self.model, batch, r.model.fp32_lm_head)
        advantages = compute_advantages(batch.rewards, batch.group_index, r.loss.advantage_norm)
        out = policy_loss(new_logprobs, batch.old_logprobs, batch.loss_mask, advantages, batch.group_index, r.loss)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = clip_grad(self.model, r.optimizer)
        if math.isfinite(grad_norm):  # a non-finite gradient skips the update, never poisons the weights
            self.optimizer.step()
        self.scheduler.step()
        versions = batch.token_versions[batch.token_versions >= 0]
        lag = int((learner_version - versions).max()) if len(versions) else 0
        return {"loss": out.loss.item(), "grad_norm": grad_norm, "tokens": batch.num_tokens,
                "mean_reward": batch.rewards.mean().item(), "max_version_lag": lag, **out.metrics}
