"""SmolLM2-135M-Instruct on this machine's CPU: conversion from GGUF, vLLM start, generator tokens/s (G sampled
completions of chat-rendered prompts, as the platform samples them) and the learner's step time (its Trainer on
those very completions: forward, backward, AdamW).

    python bench/real_model_bench.py [--prompts 4] [--generations 4] [--max-tokens 96] [--steps 3]

Prints one JSON object (docs/benchmarks/real_model.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

from scalerl.models import BUILTIN_PREFIX, SMOLLM2_NAME, resolve_model_path
from scalerl.prompts import prompt_token_ids, stop_token_ids
from scalerl.recipe import parse_recipe
from scalerl.tasks import build_prompts
from scalerl.v1 import common_pb2

ROOT = Path(__file__).resolve().parents[1]


async def sample(model_dir: Path, recipe, prompts, generations: int, max_tokens: int) -> tuple[dict, list]:
    from scalerl_generator.engine import GenerationEngine

    started = time.monotonic()
    engine = GenerationEngine(str(model_dir), seed=0, max_model_len=recipe.model.max_model_len)
    await engine.start()
    start_s = time.monotonic() - started
    tok = engine.tokenizer
    stops = stop_token_ids(tok, recipe.prompt)
    ids = [prompt_token_ids(tok, p.text, recipe.prompt) for p in prompts]
    await engine.generate(ids[0], 1, max_tokens=4, stop_token_ids=stops)  # warm-up
    t0 = time.monotonic()
    outs = await asyncio.gather(*(engine.generate(i, generations, temperature=1.0, max_tokens=max_tokens,
                                                  stop_token_ids=stops) for i in ids))
    wall = time.monotonic() - t0
    await engine.shutdown()
    tokens = sum(len(c.token_ids) for group in outs for c in group)
    groups = []
    rng = random.Random(0)
    for p, i, group in zip(prompts, ids, outs):
        groups.append(common_pb2.ScoredGroup(prompt_token_ids=i, completions=[
            common_pb2.ScoredCompletion(reward=float(rng.random() < 0.5), completion=common_pb2.Completion(
                token_ids=c.token_ids, logprobs=c.logprobs, loss_mask=c.loss_mask,
                versions=[common_pb2.VersionSpan(version=0, start=0, end=len(c.token_ids))])) for c in group]))
    return {"vllm_start_s": round(start_s, 1), "completions": sum(len(g) for g in outs),
            "generated_tokens": tokens, "generate_wall_s": round(wall, 2),
            "tokens_per_s": round(tokens / wall, 1),
            "mean_prompt_tokens": round(statistics.mean(map(len, ids)), 1)}, groups


def learner_steps(model_dir: Path, recipe, groups, steps: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl_learner.trainer import Trainer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    pad = AutoTokenizer.from_pretrained(model_dir).pad_token_id
    trainer = Trainer(model, recipe, pad)
    times = []
    for v in range(steps):
        t0 = time.monotonic()
        trainer.step(groups, learner_version=v)
        times.append(time.monotonic() - t0)
    tokens = sum(len(c.completion.token_ids) for g in groups for c in g.completions)
    return {"learner_step_s": [round(t, 2) for t in times], "learner_step_median_s": round(statistics.median(times), 2),
            "trained_tokens_per_step": tokens, "torch_threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--generations", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--data-dir", default=str(ROOT / "var"))
    a = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    recipe = parse_recipe({"model": {"path": f"{BUILTIN_PREFIX}{SMOLLM2_NAME}", "max_model_len": 256},
                           "prompt": {"system_prompt": "Solve the problem. Put the final answer in \\boxed{}."},
                           "task": {"name": "reasoning_gym/basic_arithmetic", "verifier": "math",
                                    "num_train_prompts": a.prompts, "num_validation_prompts": 1},
                           "validation": {"num_prompts": 1}, "optimizer": {"lr": 1e-5, "warmup_steps": 0}})
    t0 = time.monotonic()
    model_dir = resolve_model_path(recipe.model.path, Path(a.data_dir))
    result = {"model_dir": str(model_dir), "resolve_or_convert_s": round(time.monotonic() - t0, 1),
              "cpus": os.cpu_count(), "prompts": a.prompts, "generations": a.generations, "max_tokens": a.max_tokens}
    prompts = build_prompts(recipe.task, "train")
    gen, groups = asyncio.run(sample(model_dir, recipe, prompts, a.generations, a.max_tokens))
    result |= gen
    result |= learner_steps(model_dir, recipe, groups, a.steps)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
