"""One optimizer step of the ScaleRL objective on a batch of scored groups (no I/O: the runner does that).

Memory is bounded by the micro-batch, not the batch: advantages and the aggregation's per-token weights are
computed over the whole batch first, then each micro-batch of whole samples adds its share Σ W·L to the
gradient, so the accumulated gradient is the full-batch gradient for every loss and aggregation."""

from __future__ import annotations

import math
import threading

import torch

from scalerl.recipe import Recipe
from scalerl.v1 import common_pb2
from scalerl_learner.batch import (LogprobOptions, Sampling, TrainBatch, build_batch, micro_batches,
                                   output_logprobs, select_rows)
from scalerl_learner.losses import (LossOutput, aggregation_weights, compute_advantages, policy_loss,
                                    weighted_policy_loss)
from scalerl_learner.optim import build_optimizer, build_scheduler, clip_grad


def resolve_device(name: str) -> torch.device:
    """`auto`: CUDA when present, else CPU; `cuda` without a GPU is an error, not a silent CPU run."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("learner.device is 'cuda' but no CUDA device is available")
    return torch.device(name)


class StepInterrupted(Exception):
    """The stop event was set between micro-batches: the step was abandoned, the weights are untouched."""


class Trainer:
    def __init__(self, model, recipe: Recipe, pad_id: int, device: torch.device | str = "cpu"):
        self.model, self.recipe, self.pad_id, self.device = model, recipe, pad_id, torch.device(device)
        if recipe.learner.activation_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.optimizer = build_optimizer(model, recipe.optimizer)
        self.scheduler = build_scheduler(self.optimizer, recipe.optimizer)
        self.logprob_options = LogprobOptions(fp32_lm_head=recipe.model.fp32_lm_head,
                                              sampling=Sampling.from_recipe(recipe.generation),
                                              chunk_tokens=recipe.learner.logprob_chunk_tokens)

    def accumulate(self, batch: TrainBatch, micro_batch_tokens: int | None = None,
                   stop: threading.Event | None = None) -> tuple[LossOutput, int]:
        """Zero the gradients, then accumulate the full-batch gradient micro-batch by micro-batch. Returns the
        full-batch loss (value and metrics, no grad) and the number of micro-batches. `stop` set between
        micro-batches raises StepInterrupted (a SIGTERM waits for one micro-batch, not a whole step)."""
        r = self.recipe
        budget = micro_batch_tokens or r.learner.micro_batch_tokens
        advantages = compute_advantages(batch.rewards, batch.group_index, r.loss.advantage_norm)
        weights = aggregation_weights(batch.loss_mask, batch.group_index, r.loss.aggregation)
        new_logprobs = torch.zeros(batch.loss_mask.shape, dtype=torch.float64)
        self.optimizer.zero_grad(set_to_none=True)
        parts = micro_batches(batch, budget)
        for rows in parts:
            if stop is not None and stop.is_set():
                self.optimizer.zero_grad(set_to_none=True)
                raise StepInterrupted("stopped between micro-batches")
            micro = select_rows(batch, rows, self.device)
            new = output_logprobs(self.model, micro, self.logprob_options)
            loss = weighted_policy_loss(new, micro.old_logprobs, micro.loss_mask, advantages[rows].to(self.device),
                                        weights[rows], r.loss)
            loss.backward()
            new_logprobs[rows] = new.detach().to("cpu", torch.float64)
        # The loss value and metrics of the whole batch, from the log-probs already computed (no model pass).
        out = policy_loss(new_logprobs, batch.old_logprobs, batch.loss_mask, advantages, batch.group_index, r.loss)
        return out, len(parts)

    def step(self, groups: list[common_pb2.ScoredGroup], learner_version: int,
             stop: threading.Event | None = None) -> dict[str, float]:
        r = self.recipe
        batch = build_batch(groups, self.pad_id)
        out, parts = self.accumulate(batch, stop=stop)
        self.scheduler.observe_sampler_kl(out.metrics["approx_kl"])
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = clip_grad(self.model, r.optimizer)
        if math.isfinite(grad_norm):  # a non-finite gradient skips the update, never poisons the weights
            self.optimizer.step()
        self.scheduler.step()
        versions = batch.token_versions[batch.token_versions >= 0]
        lag = int((learner_version - versions).max()) if len(versions) else 0
        return {"loss": out.loss.item(), "grad_norm": grad_norm, "tokens": batch.num_tokens,
                "mean_reward": batch.rewards.mean().item(), "max_version_lag": lag, "micro_batches": parts,
                "lr": lr, **out.metrics}
