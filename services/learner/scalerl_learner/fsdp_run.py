"""Train a few steps of the learner under torchrun on synthetic scored groups: the distributed test, the
benchmark (tokens/s at 1 vs 2 ranks) and `make gpu-check` (FSDP on one GPU) all run this.

    torchrun --nproc_per_node 2 -m scalerl_learner.fsdp_run --model DIR --steps 5 --out DIR [--load DCP_DIR]

Rank 0 draws the groups (as it reads them from the buffer in a job) and broadcasts them; every step's loss and
time go to ``<out>/result.json``; the final full weights to ``<out>/model.safetensors``; a DCP checkpoint of
model + optimizer to ``<out>/dcp``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
import torch.distributed as dist

from scalerl.recipe import Recipe
from scalerl.v1 import common_pb2


def synthetic_groups(step: int, prompts: int, per_prompt: int, completion_tokens: int, vocab: int,
                     seed: int = 0) -> list[common_pb2.ScoredGroup]:
    """Deterministic scored groups for `step`: varied lengths, mixed rewards, generator log-probs near -1."""
    rng = random.Random(seed * 1_000_003 + step)
    groups = []
    for p in range(prompts):
        prompt = [1] + [rng.randrange(4, vocab) for _ in range(rng.randint(3, 10))]
        completions = []
        for _ in range(per_prompt):
            n = rng.randint(max(1, completion_tokens // 2), completion_tokens)
            completions.append(common_pb2.ScoredCompletion(
                completion=common_pb2.Completion(
                    token_ids=[rng.randrange(4, vocab) for _ in range(n)],
                    logprobs=[-rng.random() * 2 for _ in range(n)], loss_mask=[True] * n,
                    versions=[common_pb2.VersionSpan(version=0, start=0, end=n)]),
                reward=float(rng.random() < 0.5), grade_status=common_pb2.GRADE_STATUS_GRADED))
        groups.append(common_pb2.ScoredGroup(job_id="fsdp", group_id=f"{step}-{p}", prompt_token_ids=prompt,
                                             completions=completions))
    return groups


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="HF model directory")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--first-step", type=int, default=0, help="index of the first step's synthetic batch")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--per-prompt", type=int, default=4)
    ap.add_argument("--completion-tokens", type=int, default=12)
    ap.add_argument("--recipe-json", default="{}", help="recipe overrides (JSON)")
    ap.add_argument("--load", type=Path, default=None, help="DCP checkpoint to start from")
    ap.add_argument("--dtype", default="float32")
    return ap.parse_args(argv)


def main(argv=None) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from scalerl_learner.batch import build_batch
    from scalerl_learner.distributed import (DistributedTrainer, broadcast_groups, full_state_dict,
                                             init_process_group, load_sharded, save_sharded)
    from scalerl_learner.trainer import resolve_device

    args = parse_args(argv)
    rank, world = init_process_group()
    recipe = Recipe.model_validate(json.loads(args.recipe_json))
    device = resolve_device(recipe.learner.device)
    torch.manual_seed(recipe.seed)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype)).to(device)
    model.train()
    trainer = DistributedTrainer(model, recipe, pad_id=0, device=device)
    if args.load is not None:
        load_sharded(args.load, model, trainer.optimizer, trainer.scheduler)
    vocab = model.config.vocab_size
    steps = []
    for step in range(args.first_step, args.first_step + args.steps):
        groups = synthetic_groups(step, args.prompts, args.per_prompt, args.completion_tokens, vocab) \
            if rank == 0 else None
        groups = broadcast_groups(groups)
        if device.type == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        stats = trainer.step(groups, learner_version=0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        steps.append({"loss": stats["loss"], "grad_norm": stats["grad_norm"],
                      "seconds": time.perf_counter() - started, "tokens": int(build_batch(groups, 0).num_tokens),
                      "micro_batches": stats["micro_batches"]})
    state = full_state_dict(model)
    save_sharded(args.out / "dcp", model, trainer.optimizer, trainer.scheduler)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(args.out / "model.safetensors"))
        (args.out / "result.json").write_text(json.dumps({"world_size": world, "device": str(device),
                                                          "steps": steps}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
