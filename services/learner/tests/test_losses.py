"""Tests for scalerl_learner.losses: hand-computed values, an independent loop reference for every
loss x aggregation x normalisation, edge cases (zero variance, truncation, masking) and gradient checks."""

from __future__ import annotations

import itertools
import math
import typing

import pytest
import torch

from scalerl.recipe import (AdvantageNorm, Aggregation, CispoLossConfig, DapoLossConfig, GrpoLossConfig,
                            GspoLossConfig, LossConfig)
from scalerl_learner.losses import TOKEN_TERMS, LossOutput, compute_advantages, policy_loss

LOSSES = [CispoLossConfig, GrpoLossConfig, DapoLossConfig, GspoLossConfig]
AGGS = list(Aggregation)
NORMS = list(AdvantageNorm)


# --------------------------------------------------------------------------------------------------
# Independent reference: plain Python floats and loops, analytic per-token gradient.
# --------------------------------------------------------------------------------------------------
def ref_advantages(rewards: list[float], groups: list[int], norm: str) -> list[float]:
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    adv = [0.0] * len(rewards)
    group_std = [0.0] * len(rewards)
    for idx in members.values():
        mean = sum(rewards[i] for i in idx) / len(idx)
        var = sum((rewards[i] - mean) ** 2 for i in idx) / len(idx)
        for i in idx:
            adv[i] = rewards[i] - mean
            group_std[i] = math.sqrt(var)
    if norm == "none":
        return adv
    if norm == "batch":
        m = sum(adv) / len(adv)
        std = math.sqrt(sum((a - m) ** 2 for a in adv) / len(adv))
        return [a / std if std > 1e-8 else a for a in adv]
    return [a / s if s > 1e-8 else a for a, s in zip(adv, group_std)]


def ref_loss(new, old, mask, adv, groups, cfg: LossConfig) -> tuple[float, list[list[float]]]:
    """Returns (loss value, d loss / d new[i][t])."""
    n, t_len = len(new), len(new[0])
    terms = [[0.0] * t_len for _ in range(n)]
    derivs = [[0.0] * t_len for _ in range(n)]
    for i in range(n):
        a = adv[i]
        toks = [t for t in range(t_len) if mask[i][t]]
        if cfg.type == "gspo" and toks:
            s = math.exp(sum(new[i][t] - old[i][t] for t in toks) / len(toks))
        for t in toks:
            if cfg.type == "cispo":
                w = min(math.exp(new[i][t] - old[i][t]), cfg.eps_max)
                terms[i][t] = -w * a * new[i][t]
                derivs[i][t] = -w * a
                continue
            if cfg.type == "gspo":
                rho, lo, hi = s, 1 - cfg.gspo_clip, 1 + cfg.gspo_clip
            else:
                rho = math.exp(new[i][t] - old[i][t])
                lo = 1 - cfg.clip_low
                hi = 1 + (cfg.clip_low if cfg.type == "grpo" else cfg.clip_high)
            unclipped = rho * a
            clipped = min(max(rho, lo), hi) * a
            if clipped < unclipped:
                terms[i][t], derivs[i][t] = -clipped, 0.0
            else:
                terms[i][t], derivs[i][t] = -unclipped, -rho * a  # d rho / d new = rho
    # aggregation weights
    weight = [[0.0] * t_len for _ in range(n)]
    if cfg.aggregation == Aggregation.token:
        total = sum(sum(row) for row in mask)
        for i in range(n):
            for t in range(t_len):
                if mask[i][t]:
                    weight[i][t] = 1.0 / total
    elif cfg.aggregation == Aggregation.sample:
        live = [i for i in range(n) if sum(mask[i]) > 0]
        for i in live:
            for t in range(t_len):
                if mask[i][t]:
                    weight[i][t] = 1.0 / (sum(mask[i]) * len(live))
    else:
        ptoks: dict[int, int] = {}
        for i in range(n):
            ptoks[groups[i]] = ptoks.get(groups[i], 0) + sum(mask[i])
        live = [g for g, c in ptoks.items() if c > 0]
        for i in range(n):
            for t in range(t_len):
                if mask[i][t]:
                    weight[i][t] = 1.0 / (ptoks[groups[i]] * len(live))
    value = sum(weight[i][t] * terms[i][t] for i in range(n) for t in range(t_len))
    grad = [[weight[i][t] * derivs[i][t] for t in range(t_len)] for i in range(n)]
    return value, grad


def make_batch(seed: int = 0):
    """3 prompts (non-contiguous, interleaved ids) with 2/3/2 samples, T=4, ragged masks; log-ratios in
    [-1.6, 1.6] so CISPO truncation (log 4 = 1.386) and both PPO clip sides occur."""
    g = torch.Generator().manual_seed(seed)
    groups = [7, 2, 7, 2, 5, 2, 5]
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 1.0, 0.0]
    n, t_len = len(groups), 4
    old = -torch.rand(n, t_len, generator=g, dtype=torch.float64) * 3 - 0.1
    new = old + (torch.rand(n, t_len, generator=g, dtype=torch.float64) * 3.2 - 1.6)
    lengths = [4, 3, 4, 1, 2, 4, 3]
    mask = torch.tensor([[t < L for t in range(t_len)] for L in lengths])
    mask[2, 1] = False  # an injected (interruption-phrase) token in the middle of a completion
    return (
        torch.tensor(rewards, dtype=torch.float64),
        torch.tensor(groups),
        new,
        old,
        mask,
    )


# GSPO with the paper's 5e-3 clips nearly everything on this batch; a wider clip exercises both branches.
LOSS_PARAMS = {CispoLossConfig: {"eps_max": 4.0}, GrpoLossConfig: {"clip_low": 0.2},
               DapoLossConfig: {"clip_low": 0.2, "clip_high": 0.28}, GspoLossConfig: {"gspo_clip": 0.3}}


def cfg_for(loss: type, agg: Aggregation, norm: AdvantageNorm = AdvantageNorm.batch) -> LossConfig:
    return loss(aggregation=agg, advantage_norm=norm, **LOSS_PARAMS[loss])


# --------------------------------------------------------------------------------------------------
# Advantages
# --------------------------------------------------------------------------------------------------
def test_advantages_hand_computed():
    # 2 prompts x 2 samples: group 0 rewards (1, 0) -> Â = (0.5, -0.5); group 1 (1, 1) -> (0, 0).
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    gi = torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(compute_advantages(r, gi, AdvantageNorm.none), torch.tensor([0.5, -0.5, 0.0, 0.0]))
    # batch std of (0.5, -0.5, 0, 0) = sqrt(0.5 / 4) = 1/sqrt(8) -> 0.5 * sqrt(8) = sqrt(2)
    s2 = math.sqrt(2.0)
    torch.testing.assert_close(compute_advantages(r, gi, AdvantageNorm.batch), torch.tensor([s2, -s2, 0.0, 0.0]))
    # prompt std of (1, 0) = 0.5 -> (1, -1); zero-std group stays exactly 0
    torch.testing.assert_close(compute_advantages(r, gi, "prompt"), torch.tensor([1.0, -1.0, 0.0, 0.0]))


def test_advantages_hand_computed_group_of_three():
    # rewards (1, 0, 0): mean 1/3, Â = (2/3, -1/3, -1/3), population std = sqrt(2)/3
    r = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    gi = torch.tensor([3, 3, 3])
    std = math.sqrt(2.0) / 3
    expected = torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=torch.float64) / std
    torch.testing.assert_close(compute_advantages(r, gi, AdvantageNorm.prompt), expected)
    # single group: batch std == group std
    torch.testing.assert_close(compute_advantages(r, gi, AdvantageNorm.batch), expected)


@pytest.mark.parametrize("norm", NORMS)
def test_advantages_match_reference(norm):
    rewards, groups, *_ = make_batch()
    got = compute_advantages(rewards, groups, norm)
    expected = ref_advantages(rewards.tolist(), groups.tolist(), norm.value)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64))
    assert not got.requires_grad


@pytest.mark.parametrize("norm", NORMS)
def test_advantages_zero_variance_everywhere_is_zero_not_nan(norm):
    r = torch.tensor([0.7, 0.7, 0.0, 0.0, 1.0])
    gi = torch.tensor([0, 0, 1, 1, 2])  # last group has a single sample
    out = compute_advantages(r, gi, norm)
    assert torch.equal(out, torch.zeros(5))


def test_advantages_group_ids_are_labels_not_positions():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    a = compute_advantages(r, torch.tensor([0, 1, 0, 1, 1]), AdvantageNorm.none)
    b = compute_advantages(r, torch.tensor([42, -3, 42, -3, -3]), AdvantageNorm.none)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a, torch.tensor([0.0, -1 / 3, 0.0, 2 / 3, -1 / 3]))


def test_advantages_bad_shape():
    with pytest.raises(ValueError):
        compute_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long), AdvantageNorm.batch)


# --------------------------------------------------------------------------------------------------
# Every loss x aggregation x normalisation against the loop reference (value and gradient)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss,agg,norm", list(itertools.product(LOSSES, AGGS, NORMS)))
def test_policy_loss_matches_reference(loss, agg, norm):
    rewards, groups, new, old, mask = make_batch()
    cfg = cfg_for(loss, agg, norm)
    adv = compute_advantages(rewards, groups, cfg.advantage_norm)
    new = new.clone().requires_grad_(True)
    out = policy_loss(new, old, mask, adv, groups, cfg)
    assert isinstance(out, LossOutput) and out.loss.dim() == 0
    out.loss.backward()

    exp_adv = ref_advantages(rewards.tolist(), groups.tolist(), norm.value)
    exp_value, exp_grad = ref_loss(new.tolist(), old.tolist(), mask.tolist(), exp_adv, groups.tolist(), cfg)
    assert out.loss.item() == pytest.approx(exp_value, rel=1e-10, abs=1e-12)
    torch.testing.assert_close(new.grad, torch.tensor(exp_grad, dtype=torch.float64), rtol=1e-10, atol=1e-12)
    assert out.metrics["num_tokens"] == mask.sum().item() == 20
    assert out.metrics["num_samples"] == 7 and out.metrics["num_prompts"] == 3
    # the batch must exercise both branches of the clip / truncation, or the comparison proves little
    assert 0.0 < out.metrics["clip_fraction"] < 1.0
    assert (new.grad[mask] != 0).any()


def test_reference_batch_covers_both_clip_sides():
    """Sanity of the fixture itself: truncation above eps_max, and PPO clips with both advantage signs."""
    rewards, groups, new, old, mask = make_batch()
    rho = torch.exp(new - old)[mask]
    assert (rho > 4.0).any() and (rho < 0.8).any() and ((rho > 0.8) & (rho < 1.2)).any()


# --------------------------------------------------------------------------------------------------
# Fully hand-written cases
# --------------------------------------------------------------------------------------------------
def _hand_cispo_batch():
    # 2 prompts x 2 samples x 3 tokens, Â (norm none) = (0.5, -0.5, 0, 0).
    # sample 0: new (-1, -2, -0.5), old = new except token 2: old = -2.5 -> rho = e^2 = 7.39 -> truncated to 4
    # sample 1: new = old = -1, last token masked (interruption phrase)
    new = torch.tensor(
        [[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0], [-0.3, -0.2, -0.1], [-0.4, -0.5, -0.6]], dtype=torch.float64
    )
    old = new.clone()
    old[0, 2] = -2.5
    mask = torch.ones(4, 3, dtype=torch.bool)
    mask[1, 2] = False
    adv = torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=torch.float64)
    gi = torch.tensor([0, 0, 1, 1])
    return new, old, mask, adv, gi


@pytest.mark.parametrize(
    "agg,expected",
    [
        # token terms: sample 0: 0.5, 1.0, 1.0 (=-4*0.5*-0.5) -> 2.5; sample 1: -0.5, -0.5 -> -1.0; others 0
        (Aggregation.token, 1.5 / 11),  # 11 unmasked tokens
        (Aggregation.prompt, (1.5 / 5 + 0.0 / 6) / 2),  # = 0.15
        (Aggregation.sample, (2.5 / 3 - 1.0 / 2 + 0 + 0) / 4),  # = 1/12
    ],
)
def test_cispo_hand_values(agg, expected):
    new, old, mask, adv, gi = _hand_cispo_batch()
    new.requires_grad_(True)
    out = policy_loss(new, old, mask, adv, gi, CispoLossConfig(aggregation=agg, eps_max=4.0))
    assert out.loss.item() == pytest.approx(expected, rel=1e-12)
    assert out.metrics["num_tokens"] == 11
    assert out.metrics["clip_fraction"] == pytest.approx(1 / 11)


def test_cispo_hand_gradient_prompt_aggregation():
    new, old, mask, adv, gi = _hand_cispo_batch()
    new.requires_grad_(True)
    policy_loss(new, old, mask, adv, gi, CispoLossConfig(aggregation="prompt")).loss.backward()
    # d/dnew = -w * Â / (prompt tokens 5 * prompts 2); the truncated token has w = 4 and still gets gradient
    expected = torch.tensor(
        [[-0.05, -0.05, -0.2], [0.05, 0.05, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(new.grad, expected)


@pytest.mark.parametrize(
    "cfg,expected_terms,expected_grads",
    [
        # tokens: (Â=+1, rho=1.5), (Â=+1, rho=0.5), (Â=-1, rho=0.5), (Â=-1, rho=1.5)
        # GRPO eps 0.2: min(1.5, 1.2) = 1.2 (clipped, grad 0); min(0.5, 0.8) = 0.5 (grad -rho = -0.5);
        #               min(-0.5, -0.8) = -0.8 (clipped, grad 0); min(-1.5, -1.2) = -1.5 (grad +1.5)
        (GrpoLossConfig(aggregation=Aggregation.token, clip_low=0.2), [-1.2, -0.5, 0.8, 1.5], [0.0, -0.5, 0.0, 1.5]),
        # DAPO eps_high 0.28: the first token is clipped at 1.28 instead
        (DapoLossConfig(aggregation=Aggregation.token, clip_low=0.2, clip_high=0.28), [-1.28, -0.5, 0.8, 1.5],
         [0.0, -0.5, 0.0, 1.5]),
        # CISPO eps_max 4: no clip in this range, term = -rho*Â*new with new = log(rho) + old
        (CispoLossConfig(aggregation=Aggregation.token), None, [-1.5, -0.5, 0.5, 1.5]),
    ],
)
def test_ppo_family_hand_values(cfg, expected_terms, expected_grads):
    rhos = [1.5, 0.5, 0.5, 1.5]
    old = torch.full((4, 1), -1.0, dtype=torch.float64)
    new = (old + torch.tensor([[math.log(r)] for r in rhos], dtype=torch.float64)).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    gi = torch.arange(4)
    out = policy_loss(new, old, mask, adv, gi, cfg)
    out.loss.backward()
    if expected_terms is None:
        expected_terms = [-r * a * (math.log(r) - 1.0) for r, a in zip(rhos, [1, 1, -1, -1])]
    assert out.loss.item() == pytest.approx(sum(expected_terms) / 4, rel=1e-12)
    torch.testing.assert_close(new.grad, torch.tensor(expected_grads, dtype=torch.float64)[:, None] / 4)
    if not isinstance(cfg, CispoLossConfig):
        assert out.metrics["clip_fraction"] == pytest.approx(0.5)
        assert out.metrics["mean_ratio"] == pytest.approx(1.0)


def test_gspo_hand_values():
    # sample 0: log-ratios (0.01, -0.01, 0.03) -> s = e^0.01 = 1.01005 > 1.005 with Â = +1 -> clipped at 1.005
    # sample 1: log-ratios (0.002, 0.002, masked) -> s = e^0.002 = 1.002002, inside -> term -s*Â = +s (Â=-1)
    old = torch.full((2, 3), -0.7, dtype=torch.float64)
    lr = torch.tensor([[0.01, -0.01, 0.03], [0.002, 0.002, 5.0]], dtype=torch.float64)
    new = (old + lr).requires_grad_(True)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    cfg = GspoLossConfig(aggregation=Aggregation.sample, gspo_clip=5e-3)
    out = policy_loss(new, old, mask, adv, torch.tensor([0, 0]), cfg)
    out.loss.backward()
    s1 = math.exp(0.002)
    assert out.loss.item() == pytest.approx((-1.005 + s1) / 2, rel=1e-12)
    # sample 0 clipped -> 0 grad; sample 1: d/dnew_t = -s*Â / (2 tokens * 2 samples) = s/4
    expected = torch.tensor([[0.0, 0.0, 0.0], [s1 / 4, s1 / 4, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(new.grad, expected)
    assert out.metrics["clip_fraction"] == pytest.approx(3 / 5)
    assert out.metrics["mean_seq_ratio"] == pytest.approx((math.exp(0.01) + s1) / 2)


# --------------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("loss,agg,norm", list(itertools.product(LOSSES, AGGS, NORMS)))
def test_zero_variance_group_contributes_nothing(loss, agg, norm):
    rewards, groups, new, old, mask = make_batch()
    rewards[groups == 7] = 1.0  # all samples of prompt 7 solved -> zero-variance group
    adv = compute_advantages(rewards, groups, norm)
    assert torch.equal(adv[groups == 7], torch.zeros(2, dtype=torch.float64))
    new = new.clone().requires_grad_(True)
    cfg = cfg_for(loss, agg, norm)
    out = policy_loss(new, old, mask, adv, groups, cfg)
    out.loss.backward()
    assert torch.all(new.grad[groups == 7] == 0)
    # and the loss is unchanged by whatever the zero-advantage samples' log-probs are
    new2 = new.detach().clone()
    new2[groups == 7] -= 0.37
    assert policy_loss(new2, old, mask, adv, groups, cfg).loss.item() == pytest.approx(out.loss.item(), rel=1e-12)


@pytest.mark.parametrize("agg", AGGS)
def test_truncation_cispo_keeps_gradient_ppo_zeroes_it(agg):
    # one token with rho = e^3 = 20 > eps_max = 4 (and > 1 + clip) with Â > 0, one with rho = e^-3, Â < 0
    old = torch.tensor([[-3.5, -1.0], [-0.5, -1.0]], dtype=torch.float64)
    new_vals = torch.tensor([[-0.5, -1.0], [-3.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    gi = torch.tensor([0, 0])

    new = new_vals.clone().requires_grad_(True)
    out = policy_loss(new, old, mask, adv, gi, CispoLossConfig(aggregation=agg, eps_max=4.0))
    out.loss.backward()
    w = {Aggregation.token: 1 / 4, Aggregation.prompt: 1 / 4, Aggregation.sample: 1 / 4}[agg]
    assert new.grad[0, 0].item() == pytest.approx(-4.0 * w)  # truncated weight 4, gradient flows
    assert new.grad[1, 0].item() == pytest.approx(math.exp(-3.0) * w)  # no lower clip: weight rho
    assert out.metrics["clip_fraction"] == pytest.approx(0.25)

    for ppo_family in (GrpoLossConfig, DapoLossConfig):
        new = new_vals.clone().requires_grad_(True)
        out = policy_loss(new, old, mask, adv, gi, ppo_family(aggregation=agg))
        out.loss.backward()
        assert new.grad[0, 0].item() == 0.0  # clipped above with Â > 0: exactly zero gradient
        assert new.grad[1, 0].item() == 0.0  # clipped below with Â < 0: exactly zero gradient
        assert new.grad[0, 1].item() != 0.0 and new.grad[1, 1].item() != 0.0  # rho = 1 tokens are live
        assert out.metrics["clip_fraction"] == pytest.approx(0.5)


def test_cispo_huge_ratio_does_not_overflow():
    old = torch.tensor([[-1000.0]], dtype=torch.float64)
    new = torch.tensor([[-0.1]], dtype=torch.float64, requires_grad=True)
    out = policy_loss(new, old, torch.ones(1, 1, dtype=torch.bool), torch.tensor([2.0], dtype=torch.float64),
                      torch.tensor([0]), CispoLossConfig(eps_max=5.0))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-5.0 * 2.0 * -0.1)
    assert new.grad.item() == pytest.approx(-10.0)


@pytest.mark.parametrize("loss,agg", list(itertools.product(LOSSES, AGGS)))
def test_mask_respected(loss, agg):
    rewards, groups, new, old, mask = make_batch()
    cfg = cfg_for(loss, agg)
    adv = compute_advantages(rewards, groups, cfg.advantage_norm)
    ref = policy_loss(new, old, mask, adv, groups, cfg).loss.item()
    # put garbage (including inf / nan) in every masked position of both log-prob tensors
    new_g = new.clone()
    old_g = old.clone()
    garbage = torch.tensor([float("nan"), float("inf"), -float("inf"), 123.0], dtype=torch.float64)
    idx = (~mask).nonzero()
    for k, (i, t) in enumerate(idx.tolist()):
        new_g[i, t] = garbage[k % 4]
        old_g[i, t] = garbage[(k + 1) % 4]
    new_g.requires_grad_(True)
    out = policy_loss(new_g, old_g, mask, adv, groups, cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(ref, rel=1e-12)
    assert torch.all(new_g.grad[~mask] == 0)
    assert torch.isfinite(new_g.grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("agg", AGGS)
def test_all_masked_gives_zero_differentiable_loss(agg):
    new = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    out = policy_loss(new, new.detach(), torch.zeros(3, 4, dtype=torch.bool), torch.ones(3, dtype=torch.float64),
                      torch.tensor([0, 0, 1]), CispoLossConfig(aggregation=agg))
    out.loss.backward()
    assert out.loss.item() == 0.0 and torch.all(new.grad == 0)
    assert out.metrics["num_tokens"] == 0 and out.metrics["num_prompts"] == 0


def test_empty_prompt_excluded_from_prompt_mean():
    # prompt 1's only sample is fully masked: the mean is over the one prompt that has tokens
    new = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [False, False]])
    adv = torch.tensor([1.0, 1.0], dtype=torch.float64)
    out = policy_loss(new, new, mask, adv, torch.tensor([0, 1]), CispoLossConfig(aggregation="prompt"))
    assert out.loss.item() == pytest.approx((1.0 + 2.0) / 2)
    out = policy_loss(new, new, mask, adv, torch.tensor([0, 1]), CispoLossConfig(aggregation="sample"))
    assert out.loss.item() == pytest.approx((1.0 + 2.0) / 2)


def test_aggregations_differ_on_ragged_batch():
    """Guards against an implementation that silently ignores cfg.aggregation."""
    rewards, groups, new, old, mask = make_batch()
    adv = compute_advantages(rewards, groups, AdvantageNorm.batch)
    vals = {a: policy_loss(new, old, mask, adv, groups, cfg_for(CispoLossConfig, a)).loss.item() for a in AGGS}
    assert len({round(v, 9) for v in vals.values()}) == 3


def test_old_logprobs_receive_no_gradient_and_bf16_upcast():
    rewards, groups, new, old, mask = make_batch()
    adv = compute_advantages(rewards, groups, AdvantageNorm.batch)
    new_b = new.to(torch.bfloat16).requires_grad_(True)
    old_b = old.to(torch.bfloat16).requires_grad_(True)
    out = policy_loss(new_b, old_b, mask, adv, groups, CispoLossConfig())
    assert out.loss.dtype == torch.float32
    out.loss.backward()
    assert old_b.grad is None or torch.all(old_b.grad == 0)
    assert new_b.grad is not None and new_b.grad.dtype == torch.bfloat16


def test_shape_validation():
    new = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        policy_loss(new, torch.zeros(2, 4), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2),
                    torch.zeros(2, dtype=torch.long), CispoLossConfig())
    with pytest.raises(ValueError):
        policy_loss(new, new, torch.ones(2, 3, dtype=torch.bool), torch.zeros(3),
                    torch.zeros(2, dtype=torch.long), CispoLossConfig())


def test_metrics_keys():
    rewards, groups, new, old, mask = make_batch()
    adv = compute_advantages(rewards, groups, AdvantageNorm.batch)
    m = policy_loss(new, old, mask, adv, groups, CispoLossConfig()).metrics
    for k in ("clip_fraction", "mean_ratio", "max_ratio", "approx_kl", "num_tokens", "num_samples", "num_prompts"):
        assert isinstance(m[k], float)
    rho = torch.exp(new - old)[mask]
    assert m["mean_ratio"] == pytest.approx(rho.mean().item())
    assert m["max_ratio"] == pytest.approx(rho.max().item())
    assert m["approx_kl"] == pytest.approx((rho - 1 - torch.log(rho)).mean().item())


# --------------------------------------------------------------------------------------------------
# Gradient checks (float64, finite differences)
# --------------------------------------------------------------------------------------------------
def _smooth_batch():
    """Log-ratios kept away from every clip boundary (where the PPO objective is not differentiable)."""
    rewards, groups, new, old, mask = make_batch(seed=3)
    lr = (new - old)
    # nudge any log-ratio within 1e-3 of a boundary away from it
    for b in (math.log(0.8), math.log(1.2), math.log(1.28), math.log(4.0)):
        near = (lr - b).abs() < 1e-3
        lr = torch.where(near, lr + 5e-3, lr)
    return rewards, groups, old + lr, old, mask


@pytest.mark.parametrize("loss,agg", list(itertools.product((GrpoLossConfig, DapoLossConfig, GspoLossConfig), AGGS)))
def test_gradcheck_true_gradient(loss, agg):
    """PPO/DAPO and GSPO-token have the exact gradient of their (sequence-level, for GSPO: all tokens of a
    sample share one aggregation weight) objective, so finite differences must agree."""
    rewards, groups, new, old, mask = _smooth_batch()
    cfg = cfg_for(loss, agg)
    adv = compute_advantages(rewards, groups, AdvantageNorm.batch)
    new = new.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: policy_loss(x, old, mask, adv, groups, cfg).loss, (new,), eps=1e-6, atol=1e-7, rtol=1e-5
    )


@pytest.mark.parametrize("agg", AGGS)
def test_gradcheck_cispo_with_weight_held_fixed(agg):
    """CISPO's weight is stop-gradient, so finite differences of the loss must be taken with the ratio held
    fixed: let old follow new (old = new + const), then d loss / d new must equal -sg(w)·Â·weight."""
    rewards, groups, new, old, mask = _smooth_batch()
    cfg = cfg_for(CispoLossConfig, agg)
    adv = compute_advantages(rewards, groups, AdvantageNorm.batch)
    offset = (old - new).detach()
    new = new.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: policy_loss(x, x.detach() + offset, mask, adv, groups, cfg).loss, (new,), eps=1e-6, atol=1e-7
    )


def test_gradcheck_would_catch_a_missing_stop_gradient():
    """The plain finite-difference check is *not* satisfied by CISPO (the sg matters): if an implementation
    let gradient flow through min(rho, eps_max) this test would start passing gradcheck, and the reference
    comparison above would fail."""
    rewards, groups, new, old, mask = _smooth_batch()
    cfg = cfg_for(CispoLossConfig, Aggregation.prompt)
    adv = compute_advantages(rewards, groups, AdvantageNorm.batch)
    new = new.clone().requires_grad_(True)
    assert not torch.autograd.gradcheck(
        lambda x: policy_loss(x, old, mask, adv, groups, cfg).loss, (new,), eps=1e-6, atol=1e-7, raise_exception=False
    )


def test_every_loss_of_the_recipe_has_a_row_in_the_dispatch_table():
    (union, _discriminator) = typing.get_args(LossConfig)
    variants = {typing.get_args(tagged)[0] for tagged in typing.get_args(union)}
    assert variants == set(TOKEN_TERMS) == set(LOSSES)


def test_a_config_without_a_row_is_refused():
    class Unknown(CispoLossConfig):
        pass

    with pytest.raises(ValueError, match="no policy loss for Unknown"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), torch.zeros(1),
                    torch.zeros(1, dtype=torch.long), Unknown())
