#!/usr/bin/env python
"""Generator vs learner log-probs of the same sampled tokens (issue 13 item 4), for any model.

The vLLM engine samples G completions per prompt twice: at T = 1 with no transform (the gap is then only the two
forward passes' float32 numerics, vLLM's CPU kernels vs transformers': the floor) and at the sampling settings
under test. The learner scores the tokens under the distribution they were sampled from (logits / T, top-p
renormalised) and, for comparison, with a plain log-softmax. Sampling goes on past the answer (ignore_eos), where
the distribution is flat and top-p cuts it.

    python bench/logprob_gap.py --model builtin:smollm2-135m-instruct [--temperature 0.7 --top-p 0.9]

Prints one JSON object (docs/benchmarks/real_model.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

import torch

from scalerl.models import resolve_model_path
from scalerl.v1 import common_pb2
from scalerl_learner.batch import LogprobOptions, Sampling, build_batch, output_logprobs

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["12+34=", "7+85=", "301+9=", "55+55=", "1+2+3="]


def measure(model_dir: Path, *, temperature: float, top_p: float, prompts=PROMPTS, generations: int = 4,
            max_tokens: int = 24, max_model_len: int = 64) -> dict:
    """Max |learner - vLLM| over the sampled tokens at (temperature, top_p), the T = 1 floor, the plain
    log-softmax gap and the share of positions sampled from a nucleus of more than one token."""
    from transformers import AutoModelForCausalLM

    from scalerl_generator.engine import GenerationEngine

    async def sample():
        engine = GenerationEngine(str(model_dir), seed=0, max_model_len=max_model_len, kv_cache_gib=0.25)
        await engine.start()
        try:
            ids = [engine.tokenizer(p)["input_ids"] for p in prompts]
            out = {}
            for t, p in ((1.0, 1.0), (temperature, top_p)):
                out[t, p] = await asyncio.gather(*(engine.generate(x, generations, temperature=t, top_p=p,
                                                                   max_tokens=max_tokens, ignore_eos=True,
                                                                   sample_seed=7) for x in ids))
            return ids, out
        finally:
            await engine.shutdown()

    ids, sampled = asyncio.run(sample())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    def gaps(outs, sampling: Sampling):
        groups = [common_pb2.ScoredGroup(job_id="j", group_id=str(i), prompt_token_ids=p, completions=[
            common_pb2.ScoredCompletion(completion=common_pb2.Completion(
                token_ids=c.token_ids, logprobs=c.logprobs, loss_mask=c.loss_mask,
                versions=[common_pb2.VersionSpan(version=v, start=s, end=e) for v, s, e in c.versions]))
            for c in cs]) for i, (p, cs) in enumerate(zip(ids, outs))]
        batch = build_batch(groups, pad_id=0)
        with torch.no_grad():
            learner = output_logprobs(model, batch, LogprobOptions(sampling=sampling))
            plain = output_logprobs(model, batch, LogprobOptions())
        mask = batch.loss_mask
        return {"max_gap": (learner - batch.old_logprobs)[mask].abs().max().item(),
                "plain_log_softmax_gap": (plain - batch.old_logprobs)[mask].abs().max().item(),
                "nucleus_share": (batch.old_logprobs[mask] < -1e-3).float().mean().item(),
                "tokens": int(mask.sum())}

    floor = gaps(sampled[1.0, 1.0], Sampling(1.0, 1.0))["max_gap"]
    return {"temperature": temperature, "top_p": top_p, "floor_at_t1": floor} | gaps(
        sampled[temperature, top_p], Sampling(temperature, top_p))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="builtin:tiny-arithmetic")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.9)
    ap.add_argument("--max-model-len", type=int, default=64)
    ap.add_argument("--data-dir", default=str(ROOT / "var"))
    a = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    t0 = time.monotonic()
    model_dir = resolve_model_path(a.model, Path(a.data_dir))
    result = {"model": a.model} | measure(model_dir, temperature=a.temperature, top_p=a.top_p,
                                          max_model_len=a.max_model_len)
    print(json.dumps(result | {"wall_s": round(time.monotonic() - t0, 1)}, indent=2))


if __name__ == "__main__":
    main()
