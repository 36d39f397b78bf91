"""Tests for scalerl_learner.optim: AdamW settings and param groups, warmup schedule, gradient clipping."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from scalerl.recipe import OptimizerConfig
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
