"""Tests for scalerl_learner.optim: AdamW settings and param groups, warmup schedule, the adaptive lr, gradient
clipping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from scalerl.recipe import AdaptiveLRConfig, OptimizerConfig
from scalerl_learner.optim import build_optimizer, build_scheduler, clip_grad, warmup_factor


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.lin = nn.Linear(3, 2)  # weight (decay) + bias (no decay)
        self.norm = nn.LayerNorm(2)  # weight + bias, both no decay
        self.frozen = nn.Linear(2, 2, bias=False)
        self.frozen.weight.requires_grad_(False)


def _groups(opt):
    return {id(p): g for g in opt.param_groups for p in g["params"]}


def test_adamw_hyperparameters_from_config():
    cfg = OptimizerConfig(lr=3e-4, adam_eps=1e-15, weight_decay=0.05, betas=(0.8, 0.95))
    model = Tiny()
    opt = build_optimizer(model, cfg)
    assert isinstance(opt, torch.optim.AdamW)
    for g in opt.param_groups:
        assert g["eps"] == 1e-15
        assert g["betas"] == (0.8, 0.95)
        assert g["lr"] == 3e-4
    by_param = _groups(opt)
    assert by_param[id(model.emb.weight)]["weight_decay"] == 0.05
    assert by_param[id(model.lin.weight)]["weight_decay"] == 0.05
    for p in (model.lin.bias, model.norm.weight, model.norm.bias):
        assert by_param[id(p)]["weight_decay"] == 0.0
    assert id(model.frozen.weight) not in by_param
    assert sum(len(g["params"]) for g in opt.param_groups) == 5


def test_default_recipe_eps_is_tiny():
    opt = build_optimizer(Tiny(), OptimizerConfig())
    assert all(g["eps"] == 1e-15 for g in opt.param_groups)


def test_no_trainable_parameters_raises():
    m = nn.Linear(2, 2)
    m.requires_grad_(False)
    with pytest.raises(ValueError):
        build_optimizer(m, OptimizerConfig())


def test_decoupled_weight_decay_only_on_matrices():
    # with zero gradients the Adam update is 0, so a step only applies decoupled decay p <- p (1 - lr wd)
    cfg = OptimizerConfig(lr=0.1, weight_decay=0.5, warmup_steps=0)
    model = nn.Linear(3, 2)
    w0, b0 = model.weight.detach().clone(), model.bias.detach().clone()
    opt = build_optimizer(model, cfg)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    torch.testing.assert_close(model.weight.detach(), w0 * (1 - 0.1 * 0.5))
    torch.testing.assert_close(model.bias.detach(), b0)


def test_warmup_schedule_values():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=4)
    model = nn.Linear(2, 1)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    lrs = []
    for _ in range(7):
        lrs.append(opt.param_groups[0]["lr"])  # lr used by this optimiser step
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0, 1.0])
    assert all(g["lr"] == pytest.approx(1.0) for g in opt.param_groups)


def test_warmup_starts_near_zero_and_reaches_lr():
    cfg = OptimizerConfig(lr=5e-7, warmup_steps=100)
    opt = build_optimizer(nn.Linear(2, 1), cfg)
    sched = build_scheduler(opt, cfg)
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-9)
    for _ in range(50):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-7 * 51 / 100)
    for _ in range(100):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(5e-7)


def test_no_warmup_is_constant():
    cfg = OptimizerConfig(lr=2e-3, warmup_steps=0)
    opt = build_optimizer(nn.Linear(2, 1), cfg)
    sched = build_scheduler(opt, cfg)
    for _ in range(3):
        assert opt.param_groups[0]["lr"] == pytest.approx(2e-3)
        opt.step()
        sched.step()
    assert warmup_factor(0, 0) == 1.0 and warmup_factor(10**6, 3) == 1.0


def test_scheduler_state_roundtrip():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=10)
    opt = build_optimizer(nn.Linear(2, 1), cfg)
    sched = build_scheduler(opt, cfg)
    for _ in range(3):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2 = build_optimizer(nn.Linear(2, 1), cfg)
    sched2 = build_scheduler(opt2, cfg)
    sched2.load_state_dict(state)
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5)


def _lrs_after(cfg: OptimizerConfig, kls: list[float]) -> list[float]:
    """The lr each optimiser step used, observing one sampler KL per step (as Trainer.step does)."""
    opt = build_optimizer(nn.Linear(2, 1), cfg)
    sched = build_scheduler(opt, cfg)
    used = []
    for kl in kls:
        sched.observe_sampler_kl(kl)
        used.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return used


def test_adaptive_lr_falls_while_the_sampler_kl_runs_high_and_recovers():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=0,
                          adaptive_lr=AdaptiveLRConfig(target_sampler_kl=0.01, factor=2.0, min_lr_ratio=0.25))
    high, band, low = 0.05, 0.01, 0.001  # > 2 x target, inside [target / 2, 2 x target], < target / 2
    used = _lrs_after(cfg, [band, high, high, high, band, low, low, low, 0.0201, 0.02, 0.005])
    # dead band leaves it; high halves it down to the floor; low doubles it up to lr; the band's edges are inside
    assert used == pytest.approx([1.0, 0.5, 0.25, 0.25, 0.25, 0.5, 1.0, 1.0, 0.5, 0.5, 0.5])


def test_adaptive_lr_composes_with_warmup_and_ignores_a_non_finite_kl():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=4, adaptive_lr=AdaptiveLRConfig(target_sampler_kl=0.01))
    used = _lrs_after(cfg, [1.0, math.nan, math.inf, 0.0, 0.0, 0.0])
    assert used == pytest.approx([0.25 / 1.5, 0.5 / 1.5, 0.75 / 1.5, 1.0, 1.0, 1.0])


def test_without_adaptive_lr_the_kl_changes_nothing():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=2)
    assert _lrs_after(cfg, [10.0, 10.0, 10.0, 0.0]) == pytest.approx([0.5, 1.0, 1.0, 1.0])


def test_adaptive_scale_is_state_and_the_recipe_is_not():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=0, adaptive_lr=AdaptiveLRConfig(target_sampler_kl=0.01, factor=2.0))
    opt = build_optimizer(nn.Linear(2, 1), cfg)
    sched = build_scheduler(opt, cfg)
    sched.observe_sampler_kl(1.0)
    opt.step()
    sched.step()
    state = sched.state_dict()
    assert state["scale"] == 0.5 and "adaptive" not in state and "warmup_steps" not in state
    # a resume under another recipe keeps the damped scale and runs the new recipe's warmup and band
    resumed = OptimizerConfig(lr=1.0, warmup_steps=10, adaptive_lr=AdaptiveLRConfig(target_sampler_kl=0.1))
    opt2 = build_optimizer(nn.Linear(2, 1), resumed)
    sched2 = build_scheduler(opt2, resumed)
    sched2.load_state_dict(state)
    sched2.observe_sampler_kl(0.1)  # high for the old band, inside the new one
    assert opt2.param_groups[0]["lr"] == pytest.approx(0.5 * 2 / 10)


def test_a_damped_checkpoint_resumed_without_adaptive_lr_trains_at_the_recipes_lr():
    damped = OptimizerConfig(lr=1.0, warmup_steps=0, adaptive_lr=AdaptiveLRConfig(target_sampler_kl=0.01))
    opt = build_optimizer(nn.Linear(2, 1), damped)
    sched = build_scheduler(opt, damped)
    sched.observe_sampler_kl(1.0)
    opt.step()
    sched.step()
    plain = OptimizerConfig(lr=1.0, warmup_steps=0)
    opt2 = build_optimizer(nn.Linear(2, 1), plain)
    sched2 = build_scheduler(opt2, plain)
    sched2.load_state_dict(sched.state_dict())
    opt2.step()
    sched2.step()
    assert opt2.param_groups[0]["lr"] == pytest.approx(1.0)


def test_a_checkpoint_from_the_constant_schedule_resumes():
    cfg = OptimizerConfig(lr=1.0, warmup_steps=4)
    old_opt = build_optimizer(nn.Linear(2, 1), cfg)
    old = torch.optim.lr_scheduler.LambdaLR(old_opt, lambda step: warmup_factor(step, 4))  # before adaptive_lr
    for _ in range(2):
        old_opt.step()
        old.step()
    opt = build_optimizer(nn.Linear(2, 1), cfg)
    sched = build_scheduler(opt, cfg)
    sched.load_state_dict(old.state_dict())
    opt.step()
    sched.step()
    assert sched.scale == 1.0 and opt.param_groups[0]["lr"] == pytest.approx(1.0)


def _set_grads(model: nn.Linear, w: list[list[float]], b: list[float]) -> None:
    model.weight.grad = torch.tensor(w)
    model.bias.grad = torch.tensor(b)


def test_clip_grad_returns_preclip_norm_and_clips():
    model = nn.Linear(2, 1)
    _set_grads(model, [[3.0, 0.0]], [4.0])  # global norm 5
    norm = clip_grad(model, OptimizerConfig(grad_clip=1.0))
    assert isinstance(norm, float)
    assert norm == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[0.6, 0.0]]), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(model.bias.grad, torch.tensor([0.8]), atol=1e-6, rtol=1e-5)
    total = math.sqrt(model.weight.grad.pow(2).sum().item() + model.bias.grad.pow(2).sum().item())
    assert total == pytest.approx(1.0, rel=1e-5)


def test_clip_grad_below_threshold_is_untouched():
    model = nn.Linear(2, 1)
    _set_grads(model, [[0.3, 0.0]], [0.4])
    assert clip_grad(model, OptimizerConfig(grad_clip=1.0)) == pytest.approx(0.5)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[0.3, 0.0]]))
    torch.testing.assert_close(model.bias.grad, torch.tensor([0.4]))


def test_clip_grad_ignores_params_without_grad_and_handles_none():
    model = nn.Linear(2, 1)
    assert clip_grad(model, OptimizerConfig()) == 0.0
    model.weight.grad = torch.tensor([[6.0, 8.0]])  # bias has no grad
    assert clip_grad(model, OptimizerConfig(grad_clip=2.0)) == pytest.approx(10.0)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[1.2, 1.6]]), atol=1e-6, rtol=1e-5)


def test_clip_grad_nonfinite_is_reported_not_raised():
    model = nn.Linear(2, 1)
    _set_grads(model, [[float("inf"), 0.0]], [1.0])
    norm = clip_grad(model, OptimizerConfig())
    assert not math.isfinite(norm)
