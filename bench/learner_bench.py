"""Learner step time: the platform's Trainer.step (protobuf groups → batch → FP32-head log-probs → CISPO,
prompt aggregation, batch-normalised advantages → AdamW) vs a bare torch loop doing the same forward, backward
and step on the same, already padded tensors. Runs are interleaved so machine noise hits both alike.

    python bench/learner_bench.py [--steps 30] [--completion-tokens 48]
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from scalerl.recipe import Recipe
from scalerl.v1 import common_pb2
from scalerl_learner.batch import build_batch
from scalerl.models import build_tiny_model
from scalerl_learner.trainer import Trainer


def synthetic_groups(model, prompts: int, generations: int, prompt_tokens: int, completion_tokens: int,
                     vocab: int, seed: int) -> list[common_pb2.ScoredGroup]:
    rng = random.Random(seed)
    groups = []
    for p in range(prompts):
        prompt = [1] + [rng.randrange(4, vocab) for _ in range(prompt_tokens - 1)]
        completions = []
        for g in range(generations):
            n = rng.randint(completion_tokens // 2, completion_tokens)
            out = [rng.randrange(4, vocab) for _ in range(n)]
            completions.append(common_pb2.ScoredCompletion(
                completion=common_pb2.Completion(token_ids=out, logprobs=[-rng.random() * 3 for _ in out],
                                                 loss_mask=[True] * n,
                                                 versions=[common_pb2.VersionSpan(version=0, start=0, end=n)]),
                reward=float(rng.random() < 0.5), grade_status=common_pb2.GRADE_STATUS_GRADED))
        groups.append(common_pb2.ScoredGroup(job_id="bench", group_id=str(p), prompt_token_ids=prompt,
                                             completions=completions))
    return groups


def bare_step(model, optimizer, batch, eps_max: float) -> None:
    """The same math written inline on pre-built tensors: the floor the platform is compared against."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logprobs = torch.log_softmax(logits, -1)[:, :-1].gather(2, batch.input_ids[:, 1:, None]).squeeze(-1)
    width = batch.old_logprobs.shape[1]
    index = (batch.completion_start[:, None] - 1 + torch.arange(width)[None, :]).clamp(
        max=batch.input_ids.shape[1] - 2)
    new = logprobs.gather(1, index)
    mask = batch.loss_mask.float()
    adv = batch.rewards - batch.rewards.mean()
    adv = adv / (adv.std() + 1e-8)
    ratio = torch.exp(new.detach() - batch.old_logprobs).clamp(max=eps_max)
    loss = -(ratio * adv[:, None] * new * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=10)
    parser.add_argument("--completion-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_model(Path(tmp) / "m", sft_steps=1)
        base = AutoModelForCausalLM.from_pretrained(path)
    recipe = Recipe(optimizer={"lr": 1e-4, "warmup_steps": 0})
    platform_model, bare_model = copy.deepcopy(base), copy.deepcopy(base)
    trainer = Trainer(platform_model, recipe, pad_id=0)
    bare_opt = torch.optim.AdamW(bare_model.parameters(), lr=1e-4, eps=1e-15, weight_decay=0.01)
    groups = synthetic_groups(base, args.prompts, args.generations, args.prompt_tokens, args.completion_tokens,
                              base.config.vocab_size, seed=0)
    batch = build_batch(groups, 0)
    platform_times, bare_times = [], []
    for i in range(args.steps + 3):
        t = time.perf_counter()
        trainer.step(groups, learner_version=0)
        p = time.perf_counter() - t
        t = time.perf_counter()
        bare_step(bare_model, bare_opt, batch, recipe.loss.eps_max)
        b = time.perf_counter() - t
        if i >= 3:  # warm-up
            platform_times.append(p)
            bare_times.append(b)
    p_med, b_med = statistics.median(platform_times), statistics.median(bare_times)
    tokens = batch.num_tokens
    print(f"batch: {args.prompts} prompts x {args.generations} = {len(batch.rewards)} samples, {tokens} loss tokens, "
          f"model {sum(x.numel() for x in base.parameters()) / 1e6:.2f}M params, {args.threads} thread(s)")
    print(f"platform Trainer.step  median {p_med * 1e3:8.1f} ms")
    print(f"bare torch loop        median {b_med * 1e3:8.1f} ms")
    print(f"overhead ratio (platform / bare): {p_med / b_med:.3f}  (goal <= 1.1)")


if __name__ == "__main__":
    main()
