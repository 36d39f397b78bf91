"""The ScaleRL objective (CISPO) and the baseline policy losses, in torch (docs/scalerl.md §2).

Two entry points, both pure functions on tensors (no model, no I/O):

* :func:`compute_advantages` -- group-relative advantages with batch / prompt / no normalisation.
* :func:`policy_loss` -- the per-token policy-gradient term for CISPO, GRPO (PPO clip), DAPO or GSPO,
  aggregated per prompt, per sample or per token. The returned loss is to be *minimised*: it is the
  negative of the objective J(θ) of §2.

Shapes: N samples (completions), T padded completion positions. ``group_index[i]`` names the prompt
(group) of sample i; any integer ids work (they need not be contiguous or sorted).

Conventions (documented behaviour, pinned by tests/test_losses.py):

* Standard deviations are population std (``correction=0``), so a group of one sample or a batch of
  identical advantages has std 0 rather than NaN.
* Zero-std guard: where the std that would be divided by is ``<= eps`` (1e-8), the advantages are left
  undivided. In that case they are all exactly 0 anyway (every reward in the group, or every advantage
  in the batch, is equal), so a zero-variance group yields exactly zero advantage -- never NaN/inf.
* Zero-variance groups are *not* dropped here: their tokens contribute 0 to the loss and receive 0
  gradient, but they still count in the denominators of the aggregation (and they pull the batch std
  down). Dropping them is the caller's job (``DataConfig.zero_variance_filter``): filter first, then
  call :func:`compute_advantages` and :func:`policy_loss`.
* Masked-out positions (padding, injected tokens such as the interruption phrase) are replaced by 0
  before any arithmetic, so they contribute exactly nothing, get exactly zero gradient, and may hold
  any value (even inf/NaN) in ``new_logprobs`` / ``old_logprobs``.
* A prompt (prompt aggregation) or sample (sample aggregation) with no unmasked tokens is left out of
  the mean; if the whole batch has no unmasked token the loss is a differentiable 0.
* The loss is computed in at least float32 (bf16/fp16 inputs are upcast; float64 stays float64).

Per-token terms L_{i,t} (ρ_{i,t} = exp(new − old), Â_i the advantage):

* CISPO:  L = −sg(min(ρ, ε_max)) · Â · log π_θ. The truncated ratio is a detached weight, so *every*
  unmasked token gets gradient −min(ρ, ε_max)·Â (scaled by its aggregation weight), including tokens whose
  ratio was truncated. There is no lower clip.
* GRPO:   L = −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_low)Â)   (symmetric PPO clip).
* DAPO:   L = −min(ρÂ, clip(ρ, 1−ε_low, 1+ε_high)Â)  (asymmetric "clip-higher").
* GSPO:   s_i = exp(mean_t over sample i's unmasked tokens of (new − old)); per token we use the
  GSPO-token form s_{i,t} = sg(s_i) · π_θ(y_t) / sg(π_θ(y_t)) -- numerically equal to s_i, with gradient
  s_i·∇log π_θ(y_t) -- and L = −min(s_{i,t}Â, clip(s_{i,t}, 1−c, 1+c)Â) with c = ``gspo_clip``. The clip
  decision is therefore per sequence. Every aggregation below gives all tokens of one sample the same
  weight, so this has exactly the gradient of the sequence-level objective Σ_i W_i·min(s_iÂ_i, clip(s_i)Â_i)
  with W_i the sample's total weight (1/G for sample aggregation: the GSPO paper's objective).

Aggregation of the masked L_{i,t} (M = mask):

* prompt (ScaleRL): mean over prompts p of  Σ_{i∈p} Σ_t M·L / Σ_{i∈p} Σ_t M
* sample (GRPO):    mean over samples i of  Σ_t M·L / Σ_t M
* token (DAPO):     Σ_{i,t} M·L / Σ_{i,t} M
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from scalerl.recipe import (AdvantageNorm, Aggregation, CispoLossConfig, DapoLossConfig, GrpoLossConfig,
                            GspoLossConfig, LossConfig)

__all__ = ["STD_EPS", "LossOutput", "aggregation_weights", "compute_advantages", "policy_loss", "weighted_policy_loss"]

STD_EPS = 1e-8
"""A std at or below this is treated as zero (the advantages are then left undivided; they are all 0)."""


def _dense_groups(group_index: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer group ids to 0..G-1; returns (dense ids [N], G)."""
    uniq, inverse = torch.unique(group_index, return_inverse=True)
    return inverse, int(uniq.numel())


def _safe_div(x: Tensor, std: Tensor) -> Tensor:
    return x / torch.where(std > STD_EPS, std, torch.ones_like(std))


def compute_advantages(rewards: Tensor, group_index: Tensor, norm: AdvantageNorm | str) -> Tensor:
    """Group-relative advantages Â_i = r_i − mean(rewards of i's group), then normalised.

    * ``batch`` (ScaleRL): Â_i / std(all Â in the batch)
    * ``prompt`` (GRPO):   Â_i / std(rewards of i's group)
    * ``none``:            Â_i

    Population std; a std ``<= STD_EPS`` is not divided by (all advantages under it are 0).
    Returns a tensor of the rewards' floating dtype (float32 at least), without grad.
    """
    norm = AdvantageNorm(norm)
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and group_index {tuple(group_index.shape)} must be [N]")
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    r = rewards.detach().to(dtype)
    if r.numel() == 0:
        return r.clone()
    gid, num_groups = _dense_groups(group_index.to(r.device))
    counts = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add_(0, gid, torch.ones_like(r))
    sums = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add_(0, gid, r)
    adv = r - (sums / counts)[gid]

    if norm is AdvantageNorm.none:
        return adv
    if norm is AdvantageNorm.batch:
        return _safe_div(adv, adv.std(correction=0))
    # prompt: std of the rewards within the group == root mean square of the group's centred rewards
    sq = torch.zeros(num_groups, dtype=dtype, device=r.device).index_add_(0, gid, adv * adv)
    group_std = (sq / counts).sqrt()
    return _safe_div(adv, group_std[gid])


@dataclass
class LossOutput:
    loss: Tensor
    """Scalar, differentiable w.r.t. ``new_logprobs``; minimise it."""
    metrics: dict[str, float] = field(default_factory=dict)
    """clip_fraction, mean_ratio, max_ratio, approx_kl (k3 estimate of KL(π_gen‖π_θ): mean of ρ−1−log ρ), mean_advantage, num_tokens, num_samples,
    num_prompts (both counting only those with at least one unmasked token); GSPO adds mean_seq_ratio."""


TokenTerms = tuple[Tensor, Tensor, Tensor | None]
"""Per-token loss terms [N,T] (masked positions arbitrary-but-finite), a per-token 'clipped' flag [N,T]
(bool, before masking) and, for GSPO, the sequence ratios [N]."""


def _ppo_clip(ratio: Tensor, a: Tensor, lo: float, hi: float) -> tuple[Tensor, Tensor]:
    unclipped = ratio * a
    clipped_obj = torch.clamp(ratio, lo, hi) * a
    # The clipped branch is the active (gradient-free) one exactly when it is strictly smaller.
    clipped = (clipped_obj < unclipped).detach()
    return -torch.minimum(unclipped, clipped_obj), clipped


def _cispo_terms(cfg: CispoLossConfig, new: Tensor, old: Tensor, mask: Tensor, adv: Tensor) -> TokenTerms:
    log_ratio = (new - old).detach()
    # sg(min(ρ, ε_max)): computed in log space so a huge ratio cannot overflow to inf.
    weight = torch.exp(torch.clamp(log_ratio, max=math.log(cfg.eps_max)))
    clipped = log_ratio > math.log(cfg.eps_max)
    return -(weight * adv[:, None] * new), clipped, None


def _grpo_terms(cfg: GrpoLossConfig, new: Tensor, old: Tensor, mask: Tensor, adv: Tensor) -> TokenTerms:
    terms, clipped = _ppo_clip(torch.exp(new - old), adv[:, None], 1.0 - cfg.clip_low, 1.0 + cfg.clip_low)
    return terms, clipped, None


def _dapo_terms(cfg: DapoLossConfig, new: Tensor, old: Tensor, mask: Tensor, adv: Tensor) -> TokenTerms:
    terms, clipped = _ppo_clip(torch.exp(new - old), adv[:, None], 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    return terms, clipped, None


def _gspo_terms(cfg: GspoLossConfig, new: Tensor, old: Tensor, mask: Tensor, adv: Tensor) -> TokenTerms:
    n_tok = mask.sum(dim=1).clamp(min=1).to(new.dtype)
    seq_log_ratio = ((new - old) * mask).sum(dim=1) / n_tok
    seq_ratio = torch.exp(seq_log_ratio.detach())
    # GSPO-token: value s_i, gradient s_i * d(log pi_theta(y_t)).
    ratio = seq_ratio[:, None] * torch.exp(new - new.detach())
    terms, clipped = _ppo_clip(ratio, adv[:, None], 1.0 - cfg.gspo_clip, 1.0 + cfg.gspo_clip)
    return terms, clipped, seq_ratio


TOKEN_TERMS: dict[type, Callable[..., TokenTerms]] = {
    CispoLossConfig: _cispo_terms,
    GrpoLossConfig: _grpo_terms,
    DapoLossConfig: _dapo_terms,
    GspoLossConfig: _gspo_terms,
}
"""Each loss config class -> its per-token terms; a new loss is a config class in the recipe plus a row here."""


def policy_loss(
    new_logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    group_index: Tensor,
    cfg: LossConfig,
) -> LossOutput:
    """The policy loss (negative objective) that ``cfg`` selects, aggregated by ``cfg.aggregation``.

    ``new_logprobs`` [N,T]: learner log π_θ of each sampled token (requires grad);
    ``old_logprobs`` [N,T]: the generator's log-prob of the same token (no grad is taken through it);
    ``mask`` [N,T] bool: True for tokens in the loss; ``advantages`` [N] (from :func:`compute_advantages`,
    treated as constants); ``group_index`` [N]: prompt id of each sample (used by prompt aggregation).
    """
    if new_logprobs.dim() != 2:
        raise ValueError(f"new_logprobs must be [N,T], got {tuple(new_logprobs.shape)}")
    n = new_logprobs.shape[0]
    if old_logprobs.shape != new_logprobs.shape or mask.shape != new_logprobs.shape:
        raise ValueError(
            f"shape mismatch: new {tuple(new_logprobs.shape)}, old {tuple(old_logprobs.shape)}, "
            f"mask {tuple(mask.shape)}"
        )
    if advantages.shape != (n,) or group_index.shape != (n,):
        raise ValueError(f"advantages {tuple(advantages.shape)} and group_index {tuple(group_index.shape)} must be [{n}]")

    mask = mask.to(torch.bool)
    dtype, zero, new, old, adv, terms, clipped, seq_ratio = _token_terms(new_logprobs, old_logprobs, mask,
                                                                         advantages, cfg)
    maskf = mask.to(dtype)

    tok_per_sample = maskf.sum(dim=1)  # [N]
    sample_sums = terms.sum(dim=1)  # [N]
    aggregation = Aggregation(cfg.aggregation)
    gid, num_groups = _dense_groups(group_index.to(new.device))
    if aggregation is Aggregation.token:
        loss = sample_sums.sum() / tok_per_sample.sum().clamp(min=1)
    elif aggregation is Aggregation.sample:
        has = tok_per_sample > 0
        per_sample = sample_sums / tok_per_sample.clamp(min=1)
        loss = per_sample.sum() / has.sum().clamp(min=1).to(dtype)
    elif aggregation is Aggregation.prompt:
        num = torch.zeros(num_groups, dtype=dtype, device=new.device).index_add(0, gid, sample_sums)
        den = torch.zeros(num_groups, dtype=dtype, device=new.device).index_add(0, gid, tok_per_sample)
        has = den > 0
        loss = (num / den.clamp(min=1)).sum() / has.sum().clamp(min=1).to(dtype)
    else:  # pragma: no cover - enum is closed
        raise ValueError(f"unknown aggregation {aggregation!r}")

    # ---- metrics (one host sync) ----
    with torch.no_grad():
        ntok = maskf.sum()
        denom = ntok.clamp(min=1)
        log_ratio = (new - old).detach()
        ratio = torch.where(mask, torch.exp(log_ratio), zero)
        # k3 estimate of KL(pi_gen || pi_theta) on generator samples: rho - 1 - log rho >= 0
        k3 = torch.where(mask, torch.expm1(log_ratio) - log_ratio, zero)
        samples_with_tokens = (tok_per_sample > 0).to(dtype)
        prompts_with_tokens = torch.zeros(num_groups, dtype=dtype, device=new.device).index_add(
            0, gid, tok_per_sample
        )
        values = [
            (clipped & mask).to(dtype).sum() / denom,
            ratio.sum() / denom,
            ratio.max() if n > 0 and ratio.numel() > 0 else zero,
            k3.sum() / denom,
            (adv * samples_with_tokens).sum() / samples_with_tokens.sum().clamp(min=1),
            ntok,
            samples_with_tokens.sum(),
            (prompts_with_tokens > 0).to(dtype).sum(),
        ]
        names = [
            "clip_fraction",
            "mean_ratio",
            "max_ratio",
            "approx_kl",
            "mean_advantage",
            "num_tokens",
            "num_samples",
            "num_prompts",
        ]
        if seq_ratio is not None:
            names.append("mean_seq_ratio")
            values.append((seq_ratio * samples_with_tokens).sum() / samples_with_tokens.sum().clamp(min=1))
        metrics = dict(zip(names, torch.stack(values).tolist()))
    for k in ("num_tokens", "num_samples", "num_prompts"):
        metrics[k] = float(int(metrics[k]))
    return LossOutput(loss=loss, metrics=metrics)


def aggregation_weights(mask: Tensor, group_index: Tensor, aggregation: Aggregation | str) -> Tensor:
    """Per-token weights W [N,T] (float64, no grad) with Σ W·L equal to :func:`policy_loss`'s aggregation of
    the terms L: computed once over the whole batch, so a loss summed over micro-batches of whole samples,
    each Σ W·L on its rows (:func:`weighted_policy_loss`), is the full-batch loss and has its gradient."""
    maskf = mask.to(torch.bool).to(torch.float64)
    tok_per_sample = maskf.sum(dim=1)
    aggregation = Aggregation(aggregation)
    if aggregation is Aggregation.token:
        per_sample = torch.full_like(tok_per_sample, 1.0) / tok_per_sample.sum().clamp(min=1)
    elif aggregation is Aggregation.sample:
        has = (tok_per_sample > 0).sum().clamp(min=1)
        per_sample = 1.0 / (tok_per_sample.clamp(min=1) * has)
    else:
        gid, num_groups = _dense_groups(group_index.to(mask.device))
        den = torch.zeros(num_groups, dtype=torch.float64, device=mask.device).index_add(0, gid, tok_per_sample)
        has = (den > 0).sum().clamp(min=1)
        per_sample = 1.0 / (den.clamp(min=1)[gid] * has)
    return maskf * per_sample[:, None]


def weighted_policy_loss(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, advantages: Tensor,
                         weights: Tensor, cfg: LossConfig) -> Tensor:
    """Σ W·L over these rows (whole samples) with W from :func:`aggregation_weights` of the whole batch: one
    micro-batch's share of the policy loss. Same per-token terms and masking as :func:`policy_loss`."""
    t = _token_terms(new_logprobs, old_logprobs, mask.to(torch.bool), advantages, cfg)
    return (t.terms * weights.detach().to(dtype=t.dtype, device=t.new.device)).sum()


class _TokenTerms(NamedTuple):
    dtype: torch.dtype
    zero: Tensor
    new: Tensor
    old: Tensor
    adv: Tensor
    terms: Tensor
    clipped: Tensor
    seq_ratio: Tensor | None


def _token_terms(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, advantages: Tensor,
                 cfg: LossConfig) -> _TokenTerms:
    """The loss's per-token terms (0 where masked) in at least float32, with the masked inputs they came from."""
    dtype = torch.promote_types(new_logprobs.dtype, torch.float32)
    # Zero the masked positions first so garbage there (even inf/NaN) contributes nothing and gets 0 grad.
    zero = torch.zeros((), dtype=dtype, device=new_logprobs.device)
    new = torch.where(mask, new_logprobs.to(dtype), zero)
    old = torch.where(mask, old_logprobs.detach().to(dtype), zero)
    adv = advantages.detach().to(dtype=dtype, device=new.device)
    token_terms = TOKEN_TERMS.get(type(cfg))
    if token_terms is None:
        raise ValueError(f"no policy loss for {type(cfg).__name__}; known: {[c.__name__ for c in TOKEN_TERMS]}")
    terms, clipped, seq_ratio = token_terms(cfg, new, old, mask, adv)
    return _TokenTerms(dtype, zero, new, old, adv, torch.where(mask, terms, zero), clipped, seq_ratio)
