"""Learner benchmarks.

* ``--mode step`` (default): the platform's Trainer.step (protobuf groups → batch → FP32-head log-probs →
  CISPO, prompt aggregation, batch-normalised advantages → AdamW) vs a bare torch loop doing the same forward,
  backward and step on the same, already padded tensors. Runs are interleaved so machine noise hits both alike.
* ``--mode memory``: step time and peak memory vs batch size and micro-batch token budget, on a model whose
  32k vocabulary makes the float32 logits the largest tensor. Each configuration runs in a fresh process, one
  warm-up step (optimizer state allocated) then the measured step; on CPU the peak is the highest RSS that a
  thread sampling /proc/self/statm every millisecond saw during the step, minus the RSS just before it (torch
  has no CPU allocator statistics and tracemalloc does not see torch's allocations); on CUDA
  ``max_memory_allocated`` minus ``memory_allocated`` before the step.
* ``--mode ranks``: learner tokens/s with 1 and 2 gloo ranks (FSDP2, torchrun, ``scalerl_learner.fsdp_run``).
* ``--mode publish``: the training loop (Trainer.step, then publishing the new weights through a real
  weight-broadcast hub to relaying subscribers, each in its own process) with ``pipeline.publish_in_background``
  off and on, side by side: blocks of steps alternate between the two on one model and one transport.
  ``--device-step-s S`` replaces the CPU step by S seconds of idle host, as when an accelerator trains: on a CPU
  learner the send competes with the step for the same cores.

    python bench/learner_bench.py [--steps 30] [--completion-tokens 48]
    python bench/learner_bench.py --mode memory
    python bench/learner_bench.py --mode ranks
    python bench/learner_bench.py --mode publish [--hidden 256] [--subscribers 2] [--steps 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
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


def wide_model(path: Path, hidden: int = 128) -> Path:
    """A small Llama with a 32k vocabulary (random weights): the logits, not the body, dominate memory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32_000, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class RssPeak:
    """Highest RSS (MiB) seen by a thread polling /proc/self/statm while the context is open."""

    def __enter__(self) -> "RssPeak":
        import threading

        self.before = self.peak = rss_mb()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, rss_mb())

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def memory_child(args) -> None:
    """One configuration in this (fresh) process: prints {"seconds", "peak_mb"} as JSON."""
    from transformers import AutoModelForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_pretrained(args.model).to(device)
    model.train()
    recipe = Recipe(learner={"micro_batch_tokens": args.micro_batch_tokens, "device": device.type,
                             "logprob_chunk_tokens": args.chunk_tokens})
    trainer = Trainer(model, recipe, pad_id=0, device=device)
    groups = synthetic_groups(model, args.prompts, args.generations, args.prompt_tokens, args.completion_tokens,
                              model.config.vocab_size, seed=0)
    trainer.step(groups, learner_version=0)  # warm-up: optimizer state, allocator pools
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        t = time.perf_counter()
        stats = trainer.step(groups, learner_version=0)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        with RssPeak() as rss:
            t = time.perf_counter()
            stats = trainer.step(groups, learner_version=0)
            seconds = time.perf_counter() - t
        peak = rss.peak - rss.before
    print(json.dumps({"seconds": seconds, "peak_mb": peak, "micro_batches": stats["micro_batches"],
                      "tokens": stats["tokens"]}))


def memory_mode(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = wide_model(Path(tmp) / "wide")
        print(f"model: Llama 2 layers, hidden 128, vocab 32k; prompts x {args.generations}, completions <= "
              f"{args.completion_tokens} tokens; logprob chunk {args.chunk_tokens} tokens; peak = the step's "
              "peak RSS growth (CPU) or allocated memory (CUDA)")
        print("| samples | micro-batch tokens | micro-batches | step s | peak MB |")
        print("|---|---|---|---|---|")
        for prompts in args.batch_prompts:
            for budget in args.budgets:
                cmd = [sys.executable, __file__, "--mode", "memory-child", "--model", str(model),
                       "--prompts", str(prompts), "--generations", str(args.generations),
                       "--completion-tokens", str(args.completion_tokens), "--micro-batch-tokens", str(budget),
                       "--threads", str(args.threads), "--chunk-tokens", str(args.chunk_tokens)]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()
                r = json.loads(out[-1])
                label = "whole batch" if budget >= 10**8 else str(budget)
                print(f"| {prompts * args.generations} | {label} | {r['micro_batches']} | {r['seconds']:.2f} | "
                      f"{r['peak_mb']:.0f} |", flush=True)


def ranks_mode(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "m", sft_steps=1)
        print("| ranks | steps | tokens/step | median step s | tokens/s |")
        print("|---|---|---|---|---|")
        for nproc in (1, 2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            out = Path(tmp) / f"r{nproc}"
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                   f"--master_port={port}", "-m", "scalerl_learner.fsdp_run", "--model", str(model), "--out",
                   str(out), "--steps", str(args.steps), "--prompts", str(args.prompts), "--per-prompt",
                   str(args.generations), "--completion-tokens", str(args.completion_tokens), "--recipe-json",
                   json.dumps({"learner": {"micro_batch_tokens": args.micro_batch_tokens}})]
            subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
            steps = json.loads((out / "result.json").read_text())["steps"][2:]  # warm-up
            med = statistics.median(s["seconds"] for s in steps)
            tokens = statistics.mean(s["tokens"] for s in steps)
            print(f"| {nproc} | {len(steps)} | {tokens:.0f} | {med:.3f} | {tokens / med:.0f} |", flush=True)


def weights_subscriber(addr: str, job: str, ready, received) -> None:
    from scalerl.weights.grpc import GrpcStreamTransport

    transport = GrpcStreamTransport(addr, relay=True, relay_host="127.0.0.1")
    ready.set()
    for version in transport.subscribe(job, -1, threading.Event()):  # verified chunk by chunk, relayed on
        received.value = version.version


def publish_mode(args) -> None:
    import multiprocessing as mp

    from transformers import AutoModelForCausalLM

    from scalerl.weights.grpc import GrpcStreamTransport
    from scalerl_learner.publisher import Publisher
    from weights_bench import start_hub

    from scalerl_learner.trainer import resolve_device

    device = resolve_device(args.device)
    with tempfile.TemporaryDirectory() as tmp:
        model = AutoModelForCausalLM.from_pretrained(wide_model(Path(tmp) / "m", args.hidden)).to(device)
    trainer = Trainer(model, Recipe(optimizer={"lr": 1e-5, "warmup_steps": 0}), pad_id=0, device=device)
    groups = synthetic_groups(model, args.prompts, args.generations, args.prompt_tokens, args.completion_tokens,
                              model.config.vocab_size, seed=0)
    hub, addr = start_hub(fanout=1)
    ctx = mp.get_context("spawn")
    job = "bench-publish"
    received = [ctx.Value("q", -1) for _ in range(args.subscribers)]
    subscribers = []
    for value in received:
        ready = ctx.Event()
        subscribers.append(ctx.Process(target=weights_subscriber, args=(addr, job, ready, value), daemon=True))
        subscribers[-1].start()
        ready.wait(120)
    transport = GrpcStreamTransport(addr, delta=False)
    publishers = {"foreground": Publisher(transport, job, background=False),
                  "background": Publisher(transport, job, background=True)}
    send_seconds: dict[str, list[float]] = {name: [] for name in publishers}
    for name, publisher in publishers.items():
        publisher.on_sent = lambda version, seconds, name=name: send_seconds[name].append(seconds)
    loop: dict[str, list[float]] = {name: [] for name in publishers}
    held: dict[str, list[float]] = {name: [] for name in publishers}
    version = 0
    weight_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    try:
        for r in range(args.rounds + 1):  # round 0 warms up (buffers, the hub's store, the relay chain)
            order = list(publishers) if r % 2 == 0 else list(reversed(publishers))
            for name in order:
                publisher = publishers[name]
                for _ in range(args.steps):
                    started = time.perf_counter()
                    if args.device_step_s:
                        time.sleep(args.device_step_s)
                    else:
                        trainer.step(groups, learner_version=version)
                    version += 1
                    h = publisher.publish(version, model.state_dict())
                    if r:
                        loop[name].append(time.perf_counter() - started)
                        held[name].append(h)
                publisher.flush()
        deadline = time.monotonic() + 60
        while any(v.value < version for v in received) and time.monotonic() < deadline:
            time.sleep(0.05)
        delivered = [v.value for v in received]
    finally:
        for publisher in publishers.values():
            publisher.close(timeout=30)
        transport.close()
        for proc in (*subscribers, hub):
            proc.terminate()
    med = {name: statistics.median(v) for name, v in loop.items()}
    print(f"model {weight_bytes / 2**20:.0f} MiB ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params), "
          f"{args.prompts} prompts x {args.generations}, {args.subscribers} relaying subscriber(s), "
          f"{args.rounds} x {args.steps} steps per mode, "
          f"step: {f'{args.device_step_s} s idle host (an accelerator)' if args.device_step_s else 'Trainer.step'} "
          f"on {device}, "
          f"{torch.get_num_threads()} torch thread(s), "
          f"{os.cpu_count()} CPUs; last version {version}, subscribers have {delivered}")
    print("| publishing | loop s/step (median) | held by publishing s/step | send s (median) |")
    print("|---|---|---|---|")
    for name in publishers:
        print(f"| {name} | {med[name]:.3f} | {statistics.median(held[name]):.3f} | "
              f"{statistics.median(send_seconds[name][args.steps:]):.3f} |")
    print(f"background / foreground loop time: {med['background'] / med['foreground']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["step", "memory", "memory-child", "ranks", "publish"], default="step")
    parser.add_argument("--model", help="memory-child: model directory")
    parser.add_argument("--micro-batch-tokens", type=int, default=32_768)
    parser.add_argument("--batch-prompts", type=int, nargs="+", default=[4, 8, 16, 32],
                        help="memory: batch sizes (prompts)")
    parser.add_argument("--budgets", type=int, nargs="+", default=[10**9, 1024],
                        help="memory: micro-batch token budgets (10**9 = the whole batch at once)")
    parser.add_argument("--chunk-tokens", type=int, default=1024,
                        help="learner.logprob_chunk_tokens (memory: 10**9 = the head over all tokens at once)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=10)
    parser.add_argument("--completion-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=256, help="publish: hidden size of the 32k-vocabulary model")
    parser.add_argument("--subscribers", type=int, default=2, help="publish: relaying subscribers (processes)")
    parser.add_argument("--rounds", type=int, default=3, help="publish: measured rounds of both modes")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                        help="publish: where the model trains (on CUDA, staging is the copy into pinned host memory)")
    parser.add_argument("--device-step-s", type=float, default=0.0,
                        help="publish: instead of a CPU Trainer.step, a step as an accelerator runs it: the host's "
                             "cores idle for this long (the weights are sent unchanged)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode != "step":
        {"memory": memory_mode, "memory-child": memory_child, "ranks": ranks_mode,
         "publish": publish_mode}[args.mode](args)
        return
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
