"""Scored groups → padded training tensors. Every output token keeps the generator log-prob and the policy
version that produced it; injected tokens (the interruption phrase) stay in context but out of the loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.utils.checkpoint

from scalerl.v1 import common_pb2


@dataclass
class TrainBatch:
    input_ids: torch.Tensor       # [N, L] prompt + completion, right-padded
    attention_mask: torch.Tensor  # [N, L]
    completion_start: torch.Tensor  # [N] index in input_ids of the first output token
    old_logprobs: torch.Tensor    # [N, T] generator log-probs of output tokens
    loss_mask: torch.Tensor       # [N, T] bool
    token_versions: torch.Tensor  # [N, T] policy version per output token (-1 on padding)
    rewards: torch.Tensor         # [N]
    group_index: torch.Tensor     # [N]
    num_groups: int

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum())


def token_versions(completion: common_pb2.Completion) -> list[int]:
    versions = [-1] * len(completion.token_ids)
    for span in completion.versions:
        for i in range(span.start, min(span.end, len(versions))):
            versions[i] = span.version
    return versions


def build_batch(groups: list[common_pb2.ScoredGroup], pad_id: int) -> TrainBatch:
    rows = []
    for g_idx, group in enumerate(groups):
        prompt = list(group.prompt_token_ids)
        for scored in group.completions:
            c = scored.completion
            if not c.token_ids:
                continue
            mask = list(c.loss_mask) if len(c.loss_mask) == len(c.token_ids) else [True] * len(c.token_ids)
            rows.append((g_idx, prompt, list(c.token_ids), list(c.logprobs), mask, token_versions(c),
                         float(scored.reward)))
    if not rows:
        raise ValueError("batch has no completion tokens")
    length = max(len(r[1]) + len(r[2]) for r in rows)
    width = max(len(r[2]) for r in rows)
    # Plain lists first, one tensor per field: per-row tensor construction dominated small batches.
    ids_rows, attn_rows, old_rows, mask_rows, version_rows = [], [], [], [], []
    for _, prompt, out, logprobs, mask, vers, _ in rows:
        seq = prompt + out
        ids_rows.append(seq + [pad_id] * (length - len(seq)))
        attn_rows.append([1] * len(seq) + [0] * (length - len(seq)))
        lp = logprobs[:len(out)] + [0.0] * (len(out) - len(logprobs))
        old_rows.append(lp + [0.0] * (width - len(out)))
        mask_rows.append(mask + [False] * (width - len(out)))
        version_rows.append(vers + [-1] * (width - len(out)))
    input_ids = torch.tensor(ids_rows, dtype=torch.long)
    attention = torch.tensor(attn_rows, dtype=torch.long)
    start = torch.tensor([len(r[1]) for r in rows], dtype=torch.long)
    old = torch.tensor(old_rows, dtype=torch.float32)
    loss_mask = torch.tensor(mask_rows, dtype=torch.bool)
    versions = torch.tensor(version_rows, dtype=torch.long)
    rewards = torch.tensor([r[6] for r in rows], dtype=torch.float32)
    group_index = torch.tensor([r[0] for r in rows], dtype=torch.long)
    return TrainBatch(input_ids, attention, start, old, loss_mask, versions, rewards, group_index, len(groups))


SAMPLING_EPS = 1e-5
"""vLLM samples greedily below this temperature and then reports plain log-softmax log-probs (its _SAMPLING_EPS)."""


@dataclass(frozen=True)
class Sampling:
    """The distribution the generator sampled from: vLLM's processed log-probs are log-softmax of logits / T
    restricted to the top-p nucleus (renormalised). T = 1, top_p = 1 is the plain log-softmax."""

    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def from_recipe(cls, generation) -> "Sampling":
        return cls(float(generation.temperature), float(generation.top_p))


@dataclass(frozen=True)
class LogprobOptions:
    fp32_lm_head: bool = True
    sampling: Sampling = Sampling()
    chunk_tokens: int = 1024
    """Output tokens per chunk of the LM head + log-softmax (their float32 [chunk, V] logits exist at once)."""


def select_rows(batch: TrainBatch, rows: torch.Tensor, device: torch.device | str = "cpu") -> TrainBatch:
    """Rows `rows` of `batch` as a batch of their own, trimmed to their longest sequence, on `device`."""
    length = int(batch.attention_mask[rows].sum(dim=1).max())
    return TrainBatch(batch.input_ids[rows, :length].to(device), batch.attention_mask[rows, :length].to(device),
                      batch.completion_start[rows].to(device), batch.old_logprobs[rows].to(device),
                      batch.loss_mask[rows].to(device), batch.token_versions[rows], batch.rewards[rows],
                      batch.group_index[rows], batch.num_groups)


def micro_batches(batch: TrainBatch, max_tokens: int) -> list[torch.Tensor]:
    """Row indices of each micro-batch: whole samples, longest first, packed while rows x longest length stays
    within `max_tokens` (a sample longer than the budget is a micro-batch alone)."""
    lengths = batch.attention_mask.sum(dim=1)
    order = torch.argsort(lengths, descending=True, stable=True).tolist()
    chunks: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for row in order:
        n = int(lengths[row])
        if current and (len(current) + 1) * max(longest, n) > max_tokens:
            chunks.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, n)
    if current:
        chunks.append(current)
    return [torch.tensor(sorted(c), dtype=torch.long) for c in chunks]


def sampling_logprobs(logits: torch.Tensor, targets: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """log-prob of `targets` [M] under the sampling distribution of `logits` [M, V], computed as vLLM's sampler
    computes processed_logprobs (float32; temperature division; top-p by an ascending sort whose cumulative
    probability <= 1 - p is dropped, the most likely token always kept). One deliberate difference: the target
    token always stays in the nucleus, so a token the current policy would no longer sample gets a finite
    log-prob (with the generator's weights the target was sampled from the nucleus, so nothing changes)."""
    logits = logits.float()
    if sampling.temperature < SAMPLING_EPS:
        return logits.log_softmax(dim=-1).gather(1, targets[:, None]).squeeze(1)
    logits = logits / torch.tensor(sampling.temperature, dtype=torch.float32, device=logits.device)
    if sampling.top_p < 1.0:
        with torch.no_grad():
            ascending, index = logits.sort(dim=-1, descending=False)
            cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
            one_minus_p = 1 - torch.tensor(sampling.top_p, dtype=torch.float32, device=logits.device)
            drop_sorted = cumulative <= one_minus_p
            drop_sorted[:, -1] = False
            drop = torch.empty_like(drop_sorted).scatter_(1, index, drop_sorted)
            drop.scatter_(1, targets[:, None], False)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.log_softmax(dim=-1).gather(1, targets[:, None]).squeeze(1)


def _head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                   fp32: bool, sampling: Sampling) -> torch.Tensor:
    if fp32:
        dtype = torch.promote_types(hidden.dtype, torch.float32)
        logits = torch.nn.functional.linear(hidden.to(dtype), weight.to(dtype),
                                            None if bias is None else bias.to(dtype))
    else:
        logits = torch.nn.functional.linear(hidden, weight, bias)  # rounded to the body's dtype, as vLLM's head
    return sampling_logprobs(logits, targets, sampling)


def output_logprobs(model, batch: TrainBatch, options: LogprobOptions = LogprobOptions()) -> torch.Tensor:
    """log π_θ of each output token under the sampling distribution, [N, T]; 0 where `loss_mask` is False.

    The body runs once over the batch; the LM head and log-softmax run only at loss positions, `chunk_tokens`
    at a time, each chunk under activation checkpointing when grad is on: the float32 logits of one chunk are
    the most that ever exist (forward and backward), never [N, L, V]. With fp32_lm_head the head's matmul and
    everything after it run in float32 even when the body runs in bf16."""
    hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    head = model.get_output_embeddings()
    rows, cols = batch.loss_mask.nonzero(as_tuple=True)
    # log p(x_{j+1} | x_{<=j}): output token t of row i sits at start_i + t and is predicted at start_i + t - 1.
    positions = batch.completion_start[rows] + cols
    targets = batch.input_ids[rows, positions]
    picked = hidden[rows, positions - 1]
    pieces = []
    for at in range(0, len(rows), options.chunk_tokens):
        args = (picked[at:at + options.chunk_tokens], head.weight, head.bias, targets[at:at + options.chunk_tokens],
                options.fp32_lm_head, options.sampling)
        if torch.is_grad_enabled():
            pieces.append(torch.utils.checkpoint.checkpoint(_head_logprobs, *args, use_reentrant=False))
        else:
            pieces.append(_head_logprobs(*args))
    out_dtype = torch.promote_types(hidden.dtype, torch.float32)
    out = torch.zeros(batch.loss_mask.shape, dtype=out_dtype, device=hidden.device)
    if pieces:
        out = out.index_put((rows, cols), torch.cat(pieces).to(out_dtype))
    return out
