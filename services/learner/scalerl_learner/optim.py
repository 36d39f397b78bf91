"""Optimiser, LR schedule and gradient clipping for the learner (recipe ``OptimizerConfig``).

* :func:`build_optimizer` -- AdamW with ``lr``, ``betas``, ``eps=adam_eps`` (ScaleRL: 1e-15) and
  ``weight_decay``. Weight decay is applied only to parameters with ``ndim >= 2`` (weight matrices,
  embeddings); biases and norm gains (``ndim < 2``) go in a second group with ``weight_decay=0``.
  Parameters with ``requires_grad=False`` (frozen) are left out. Empty groups are omitted.
* :func:`build_scheduler` -- linear warmup then constant: the k-th optimiser step (0-based, i.e. the
  step taken after k ``scheduler.step()`` calls) uses ``lr * min(1, (k + 1) / warmup_steps)``, so the
  first step uses ``lr / warmup_steps`` (never a wasted step at lr 0) and step ``warmup_steps - 1``
  onwards uses the full ``lr``. ``warmup_steps == 0`` means constant ``lr`` from the start.
  Call ``optimizer.step()`` then ``scheduler.step()`` once per training step. With ``adaptive_lr`` set,
  :meth:`LRSchedule.observe_sampler_kl` before ``optimizer.step()`` scales that step's lr (and the following
  ones) by a factor in [``min_lr_ratio``, 1] that the sampler KL moves; the factor is part of the state dict.
* :func:`clip_grad` -- clips the global L2 norm of all gradients to ``grad_clip`` and returns the
  *pre-clip* norm as a float. A non-finite norm is returned as is (inf/nan) without raising, so the
  caller can skip the step; parameters without a gradient are ignored (no gradients at all -> 0.0).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from scalerl.recipe import AdaptiveLRConfig, OptimizerConfig

__all__ = ["LRSchedule", "build_optimizer", "build_scheduler", "clip_grad", "warmup_factor"]


def build_optimizer(model: nn.Module, cfg: OptimizerConfig) -> torch.optim.AdamW:
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": cfg.weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    if not groups:
        raise ValueError("model has no trainable parameters")
    return torch.optim.AdamW(
        groups,
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )


def warmup_factor(step: int, warmup_steps: int) -> float:
    """LR multiplier for optimiser step ``step`` (0-based): linear warmup to 1, then 1."""
    if warmup_steps <= 0:
        return 1.0
    return min(1.0, (step + 1) / warmup_steps)


class LRSchedule(LRScheduler):
    """lr × warmup factor × adaptive scale; the scale stays 1 without ``adaptive_lr``."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup_steps: int, adaptive: AdaptiveLRConfig | None):
        self.warmup_steps, self.adaptive, self.scale = warmup_steps, adaptive, 1.0
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        scale = self.scale if self.adaptive is not None else 1.0  # a damped checkpoint resumed without the knob
        factor = warmup_factor(self.last_epoch, self.warmup_steps) * scale
        return [base * factor for base in self.base_lrs]

    def observe_sampler_kl(self, kl: float) -> None:
        """Move the scale by this step's sampler KL and apply it to this step's lr."""
        a = self.adaptive
        if a is None or not math.isfinite(kl):
            return
        if kl > 2 * a.target_sampler_kl:
            self.scale = max(a.min_lr_ratio, self.scale / a.factor)
        elif kl < a.target_sampler_kl / 2:
            self.scale = min(1.0, self.scale * a.factor)
        self._last_lr = self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, self._last_lr):
            group["lr"] = lr

    def state_dict(self) -> dict:
        state = super().state_dict()
        for key in ("warmup_steps", "adaptive"):  # the recipe's, not state: a resume runs the recipe it is given
            state.pop(key)
        return state


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig) -> LRSchedule:
    return LRSchedule(optimizer, cfg.warmup_steps, cfg.adaptive_lr)


def clip_grad(model: nn.Module, cfg: OptimizerConfig) -> float:
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=cfg.grad_clip, error_if_nonfinite=False)
    return float(norm)
