"""Scored groups → padded training tensors. Every output token keeps the generator log-prob and the policy
version that produced it; injected tokens (the interruption phrase) stay in context but out of the loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch

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


def output_logprobs(model, batch: TrainBatch, fp32_lm_head: bool) -> torch.Tensor:
    """log π_θ of each output token, [N, T]. With fp32_lm_head the logits and log-softmax run in float32
    even when the body runs in bf16."""
    hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
    head = model.lm_head
    if fp32_lm_head:
        logits = torch.nn.functional.linear(hidden.float(), head.weight.float(),
                                            None if head.bias is None else head.bias.float())
    else:
        logits = head(hidden)
    logprobs_all = torch.log_softmax(logits.float() if fp32_lm_head else logits, dim=-1)
    width = batch.old_logprobs.shape[1]
    length = batch.input_ids.shape[1]
    # log p(x_{j+1} | x_{<=j}) at every position j; output token t of row i sits at start_i + t.
    next_token = logprobs_all[:, :-1].gather(2, batch.input_ids[:, 1:, None]).squeeze(-1)
    index = (batch.completion_start[:, None] - 1 + torch.arange(width)[None, :]).clamp(max=length - 2)
    return next_token.gather(1, index)
