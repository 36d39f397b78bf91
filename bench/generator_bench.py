#!/usr/bin/env python
"""Generator engine benchmark: in-flight weight-update pause and sampling throughput of `GenerationEngine`,
vs vLLM's offline `LLM` on the same model and prompts (docs/benchmarks/generator.md).

Usage: VLLM_CPU_KVCACHE_SPACE=1 python bench/generator_bench.py --prompts 32 --n 4 --max-tokens 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from scalerl_generator.engine import GiB, GenerationEngine


def main() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="", help="HF model dir (default: build the tiny model)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--updates", type=int, default=5)
    p.add_argument("--max-model-len", type=int, default=128)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--cpu-rounds", type=int, default=3, help="interleaved rounds of the request-sharing CPU check")
    a = p.parse_args()

    model = a.model
    if not model:
        from scalerl.models import build_tiny_model

        model = str(build_tiny_model(Path(tempfile.mkdtemp()) / "tiny", sft_steps=20))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(f"{i}+{2 * i + 1}=")["input_ids"] for i in range(a.prompts)]
    from safetensors.torch import load_file

    state = {}  # the named tensors an update hands the engine
    for f in sorted(Path(model).glob("*.safetensors")):
        state.update(load_file(f))
    out: dict = {"model": model, "prompts": a.prompts, "n": a.n, "max_tokens": a.max_tokens}

    async def engine_side():
        eng = GenerationEngine(model, max_model_len=a.max_model_len, dtype=a.dtype)
        await eng.start()
        await eng.generate(prompts[0], 2, max_tokens=8)  # warm-up
        # tokens/s (median of 3 rounds)
        rates = []
        for _ in range(3):
            t = time.perf_counter()
            res = await asyncio.gather(*(eng.generate(pr, a.n, max_tokens=a.max_tokens, ignore_eos=True)
                                         for pr in prompts))
            dt = time.perf_counter() - t
            ntok = sum(len(c.token_ids) for r in res for c in r)
            rates.append(ntok / dt)
        out["engine_tokens_per_round"] = ntok
        out["engine_tok_per_s"] = [round(r, 1) for r in rates]
        # CPU per round of the demo's shape (64 prompts x 8 short completions, each ends itself): the 8 as one
        # request of 8 sequences (what generate does for completions with one token cap) vs 8 requests of one,
        # interleaved in this process so both see the same machine
        short = [tok(f"{10 + i}+{(7 * i) % 90 + 10}=")["input_ids"] for i in range(64)]
        stop = [tok.eos_token_id]
        shapes = {"one_request_of_8": lambda pr: eng.generate(pr, 8, max_tokens=32, stop_token_ids=stop),
                  "8_requests_of_1": lambda pr: asyncio.gather(*(eng.generate(pr, 1, max_tokens=32,
                                                                              stop_token_ids=stop)
                                                                 for _ in range(8)))}
        cpu: dict[str, list[float]] = {k: [] for k in shapes}
        for _ in range(a.cpu_rounds):
            for name, shape in shapes.items():
                c0 = time.process_time()
                for _ in range(5):
                    await asyncio.gather(*(shape(pr) for pr in short))
                cpu[name].append(time.process_time() - c0)
        out["cpu_s_per_5_rounds_of_64x8"] = {k: [round(x, 2) for x in v] for k, v in cpu.items()}
        out["cpu_ratio_shared_vs_separate"] = round(sum(cpu["one_request_of_8"]) / sum(cpu["8_requests_of_1"]), 3)
        # idle load (nothing in flight) vs in-flight update pause
        idle, idle_load, flight, flight_load = [], [], [], []
        for v in range(1, a.updates + 1):
            idle.append(await eng.update_weights(state, v))
            idle_load.append(eng.last_load_seconds)
        v = a.updates
        for _ in range(a.updates):
            v += 1
            started = asyncio.Event()

            def cb(i: int, k: int) -> None:
                if k >= 5:
                    started.set()

            task = asyncio.ensure_future(asyncio.gather(*(eng.generate(pr, a.n, max_tokens=a.max_tokens,
                                                                       ignore_eos=True, on_tokens=cb)
                                                          for pr in prompts[:4])))
            await started.wait()
            flight.append(await eng.update_weights(state, v))
            flight_load.append(eng.last_load_seconds)
            res = await task
            out.setdefault("inflight_completions_spanning_2_versions", []).append(
                sum(len(c.versions) == 2 for r in res for c in r))
        rpc = []
        for _ in range(a.updates):
            t = time.perf_counter()
            await eng.collective_rpc("scalerl_load_weights", args=(state,))
            rpc.append(time.perf_counter() - t)
        out["plain_load_rpc_s_median"] = round(statistics.median(rpc), 4)
        out["update_idle_pause_s_median"] = round(statistics.median(idle), 4)
        out["update_inflight_pause_s_median"] = round(statistics.median(flight), 4)
        out["worker_load_s_median"] = round(statistics.median(idle_load + flight_load), 4)
        await eng.shutdown()

    asyncio.run(engine_side())

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=model, max_model_len=a.max_model_len, dtype=a.dtype, enforce_eager=True,
              kv_cache_memory_bytes=GiB, disable_log_stats=True, logprobs_mode="processed_logprobs")
    sp = SamplingParams(n=a.n, temperature=1.0, max_tokens=a.max_tokens, ignore_eos=True, logprobs=0)
    llm.generate([TokensPrompt(prompt_token_ids=prompts[0])], SamplingParams(n=2, max_tokens=8))
    rates = []
    for _ in range(3):
        t = time.perf_counter()
        res = llm.generate([TokensPrompt(prompt_token_ids=pr) for pr in prompts], sp, use_tqdm=False)
        dt = time.perf_counter() - t
        ntok = sum(len(c.token_ids) for r in res for c in r.outputs)
        rates.append(ntok / dt)
    out["offline_tokens_per_round"] = ntok
    out["offline_tok_per_s"] = [round(r, 1) for r in rates]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":  # vLLM may re-import this module in worker processes
    main()
