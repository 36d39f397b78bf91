#!/usr/bin/env python
"""Single-process synchronous RL baseline on the tiny demo model (the curve the platform is compared with).

One loop, one process: sample G completions for each training prompt, grade them exactly (last integer ==
answer, like the reward-grader's `exact_numeric`), drop zero-variance groups and sample more prompts until the
batch holds P groups with variance (as the platform's replay buffer does), CISPO loss with prompt-average
aggregation and batch advantage normalisation (`scalerl_learner.losses`, configured by `scalerl.recipe`), one
AdamW step; repeat. Prompts whose pass-rate history reaches the No-Positive-Resampling threshold are retired.
Every E steps: validation mean@k on a fixed subset of the held-out prompts.

Generation engine (`--engine`):
  vllm  vLLM in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), the platform's sampling settings and
        log-probs mode; after every step the new weights are loaded into it with the platform's worker
        extension (`scalerl_load_weights`, named tensors) and its prefix cache is reset. The platform's
        generation, minus the services: the like-for-like baseline.
  hf    HF `generate` on the learner's own model (no weight copy at all; 3-5x faster than vLLM at this size).

    python bench/sync_loop.py --engine vllm --steps 400 --prompts-per-batch 32 --generations 8 --lr 3e-4 \
        --seed 0 --eval-every 10 --out curve.csv [--target 0.6] [--model-dir DIR]

Prints and writes (step, generated_tokens, wall_seconds, val_pass_rate, per-digit pass rates). wall_seconds
counts training, generation and weight loading only (validation time is excluded so eval frequency does not
skew it); `startup_seconds` (model and engine load) is printed separately.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services" / "learner"))
sys.path.insert(0, str(ROOT / "shared"))

from scalerl.recipe import CispoLossConfig, DataConfig, OptimizerConfig, TaskConfig  # noqa: E402
from scalerl.tasks import TaskPrompt, build_prompts  # noqa: E402

try:
    from scalerl_learner.losses import compute_advantages, policy_loss
except ImportError:  # pragma: no cover - only before losses.py landed
    raise SystemExit("scalerl_learner.losses is missing: this benchmark uses the platform's CISPO loss")
from scalerl_learner.optim import build_optimizer, build_scheduler, clip_grad  # noqa: E402
from scalerl.models import build_tiny_model  # noqa: E402

_INT = re.compile(r"-?\d+")


def grade(response: str, answer: str) -> float:
    found = _INT.findall(response.rsplit("</think>", 1)[-1])
    return 1.0 if found and int(found[-1]) == int(answer) else 0.0


class Policy:
    def __init__(self, model_dir: Path, max_new_tokens: int):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.max_new_tokens = max_new_tokens
        self.vocab = self.tok.get_vocab()
        self.bos, self.eos, self.pad = self.tok.bos_token_id, self.tok.eos_token_id, self.tok.pad_token_id

    def encode(self, text: str) -> list[int]:
        return [self.bos] + [self.vocab.get(c, self.tok.unk_token_id) for c in text]

    @torch.no_grad()
    def sample(self, prompts: list[TaskPrompt], n: int) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
        """n completions per prompt: (prompt ids, completion ids up to and including </s>, their logprobs)."""
        self.model.eval()
        enc = [self.encode(p.text) for p in prompts for _ in range(n)]
        width = max(map(len, enc))
        ids = torch.tensor([[self.pad] * (width - len(e)) + e for e in enc])
        out = self.model.generate(
            ids, attention_mask=(ids != self.pad).long(), max_new_tokens=self.max_new_tokens, do_sample=True,
            temperature=1.0, top_k=0, top_p=1.0, eos_token_id=self.eos, pad_token_id=self.pad,
            output_logits=True, return_dict_in_generate=True,
        )
        gen = out.sequences[:, width:]
        logp = torch.stack(out.logits, dim=1).float().log_softmax(-1).gather(-1, gen[..., None])[..., 0]
        comps, lps = [], []
        for row, lrow in zip(gen.tolist(), logp.tolist()):
            cut = row.index(self.eos) + 1 if self.eos in row else len(row)
            comps.append(row[:cut])
            lps.append(lrow[:cut])
        return enc, comps, lps

    def text(self, completion: list[int]) -> str:
        return self.tok.decode(completion, skip_special_tokens=True)

    def logprobs(self, prompts: list[list[int]], comps: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Learner log-probs [N,T] of each completion token (right-padded, natural positions) and the mask."""
        seqs = [p + c for p, c in zip(prompts, comps)]
        width = max(map(len, seqs))
        ids = torch.tensor([s + [self.pad] * (width - len(s)) for s in seqs])
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        logits = self.model(input_ids=ids, attention_mask=attn).logits.float()
        lp = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
        tmax = max(map(len, comps))
        new = torch.zeros(len(seqs), tmax)
        mask = torch.zeros(len(seqs), tmax, dtype=torch.bool)
        rows, cols, src = [], [], []
        for i, (p, c) in enumerate(zip(prompts, comps)):
            for t in range(len(c)):
                rows.append(i)
                cols.append(t)
                src.append(len(p) - 1 + t)
        r, c_, s = torch.tensor(rows), torch.tensor(cols), torch.tensor(src)
        new = new.index_put((r, c_), lp[r, s])
        mask[r, c_] = True
        return new, mask


class VllmSampler:
    """Generation on vLLM in this process, weights loaded from the learner after every step."""

    def __init__(self, model_dir: Path, max_new_tokens: int, seed: int, policy: Policy):
        import os

        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        sys.path.insert(0, str(ROOT / "services" / "generator"))
        from vllm import LLM

        from scalerl_generator.engine import GenerationEngine

        # The generator's own engine configuration (log-probs mode, FP32 head, worker extension, cache).
        self.llm = LLM.from_engine_args(GenerationEngine(str(model_dir), seed=seed, max_model_len=64).engine_args())
        self.max_new_tokens = max_new_tokens
        self.policy = policy

    def sample(self, prompts: list[TaskPrompt], n: int) -> tuple[list[list[int]], list[list[int]], list[list[float]]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        ids = [self.policy.encode(p.text) for p in prompts]
        params = SamplingParams(n=n, temperature=1.0, top_p=1.0, max_tokens=self.max_new_tokens, logprobs=0)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=i) for i in ids], params, use_tqdm=False)
        enc, comps, lps = [], [], []
        for i, out in zip(ids, outs):
            for c in out.outputs:
                enc.append(i)
                comps.append(list(c.token_ids))
                lps.append([lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)])
        return enc, comps, lps

    def load(self, model) -> None:
        # copies: the worker keeps the last good tensors for its rollback, the learner keeps training its own
        tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.llm.collective_rpc("scalerl_load_weights", args=(tensors,))
        self.llm.reset_prefix_cache()  # on-policy: no KV computed by the old weights is reused


def evaluate(policy: Policy, sampler, prompts: list[TaskPrompt], k: int, chunk: int = 256) -> tuple[float, dict[int, float]]:
    scores: list[float] = []
    by_digits: dict[int, list[float]] = {}
    per_chunk = max(1, chunk // k)
    for i in range(0, len(prompts), per_chunk):
        batch = prompts[i:i + per_chunk]
        _, comps, _ = sampler.sample(batch, k)
        for j, comp in enumerate(comps):
            p = batch[j // k]
            r = grade(policy.text(comp), p.answer)
            scores.append(r)
            by_digits.setdefault(p.metadata.get("digits", 0), []).append(r)
    return sum(scores) / len(scores), {d: sum(v) / len(v) for d, v in sorted(by_digits.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="generation engine (see above)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--prompts-per-batch", type=int, default=32)
    ap.add_argument("--generations", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-prompts", type=int, default=200)
    ap.add_argument("--eval-samples", type=int, default=4, help="k of mean@k")
    ap.add_argument("--max-new-tokens", type=int, default=8,
                    help="the platform's is thinking_budget_high + solution_budget, capped by the model's room")
    ap.add_argument("--target", type=float, default=None, help="stop when val pass rate reaches this")
    ap.add_argument("--target-window", type=int, default=1,
                    help="the target counts as reached when the mean of the last this-many validation points "
                         "reaches it (3 smooths validation noise; the platform's runs are scored the same way)")
    ap.add_argument("--max-seconds", type=float, default=None, help="stop after this much training wall time")
    ap.add_argument("--model-dir", type=Path, default=None, help="default: build the tiny model (seed 0)")
    ap.add_argument("--out", type=Path, default=None, help="CSV of the curve")
    ap.add_argument("--sft-steps", type=int, default=None, help="warm-up steps when building (default: tinymodel's)")
    ap.add_argument("--difficulty", type=str, default=None, help='JSON mix, e.g. \'{"2": 0.8, "3": 0.2}\'')
    ap.add_argument("--train-prompts", type=int, default=None, help="default: TaskConfig's")
    ap.add_argument("--npr", type=lambda v: None if v == "off" else float(v), default=0.9,
                    help="No-Positive-Resampling threshold on the pass-rate history (1.0: only prompts never failed; "
                         "off: never retire)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model_dir = args.model_dir
    if model_dir is None:
        model_dir = Path(tempfile.mkdtemp(prefix="tiny-")) / "model"
        t = time.monotonic()
        kw = {} if args.sft_steps is None else {"sft_steps": args.sft_steps}
        build_tiny_model(model_dir, seed=0, **kw)
        print(f"# built tiny model in {time.monotonic() - t:.1f}s at {model_dir}", flush=True)
    t = time.monotonic()
    policy = Policy(model_dir, args.max_new_tokens)
    sampler = VllmSampler(model_dir, args.max_new_tokens, args.seed, policy) if args.engine == "vllm" else policy
    print(f"# startup_seconds={time.monotonic() - t:.1f} engine={args.engine}", flush=True)

    task_kw: dict = {}
    if args.difficulty:
        task_kw["difficulty"] = json.loads(args.difficulty)
    if args.train_prompts:
        task_kw["num_train_prompts"] = args.train_prompts
    task = TaskConfig(seed=args.seed, **task_kw)
    loss_cfg = CispoLossConfig()  # CISPO, eps_max 4, prompt-average, batch advantage normalisation
    data_cfg = DataConfig(no_positive_resampling_threshold=args.npr)
    npr_threshold = data_cfg.no_positive_resampling_threshold
    opt_cfg = OptimizerConfig(lr=args.lr, warmup_steps=args.warmup)
    optim = build_optimizer(policy.model, opt_cfg)
    sched = build_scheduler(optim, opt_cfg)

    train = build_prompts(task, "train")
    val_kw = {k: v for k, v in task_kw.items() if k == "difficulty"}
    val = build_prompts(TaskConfig(**val_kw), "validation")[: args.eval_prompts]  # fixed subset across seeds
    active = list(range(len(train)))
    retired: set[int] = set()
    attempts: dict[int, int] = {}
    successes: dict[int, float] = {}
    order: list[int] = []

    def next_batch(size: int) -> list[int]:
        nonlocal order
        batch = []
        while len(batch) < size:
            if not order:
                order = [i for i in active if i not in retired]
                if not order:
                    order = list(active)  # everything retired: start over rather than stop
                rng.shuffle(order)
            batch.append(order.pop())
        return batch

    rows: list[dict] = []
    writer = None
    fh = None
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fh = args.out.open("w", newline="")

    wall = 0.0
    eval_wall = 0.0  # validation after step 0: a synchronous loop stops training for it, the platform does not
    tokens = 0
    reached = None

    def record(step: int) -> float:
        nonlocal writer
        torch.manual_seed(10_000 + step)  # validation sampling does not perturb the training RNG stream
        state = torch.random.get_rng_state()
        rate, by_d = evaluate(policy, sampler, val, args.eval_samples)
        torch.random.set_rng_state(state)
        row = {"step": step, "generated_tokens": tokens, "wall_seconds": round(wall, 2)}
        row["val_pass_rate"] = round(rate, 4)
        row.update({f"val_d{d}": round(v, 4) for d, v in by_d.items()})
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
        if fh is not None:
            if writer is None:
                writer = csv.DictWriter(fh, fieldnames=list(row))
                writer.writeheader()
            writer.writerow(row)
            fh.flush()
        return rate

    torch.manual_seed(args.seed)
    rate = record(0)
    for step in range(1, args.steps + 1):
        t0 = time.monotonic()
        # Sample until the batch holds P groups with variance (zero-variance groups are dropped, as in the
        # platform's buffer); each round asks for just the groups still missing.
        g = args.generations
        prompts, enc, comps, old, rewards = [], [], [], [], []
        seen = 0
        while True:
            need = args.prompts_per_batch - len(prompts)
            if need == 0:
                break
            idx = next_batch(need)
            chunk = [train[i] for i in idx]
            c_enc, c_comps, c_old = sampler.sample(chunk, g)
            tokens += sum(map(len, c_comps))
            c_rewards = [grade(policy.text(c), chunk[j // g].answer) for j, c in enumerate(c_comps)]
            for j, i in enumerate(idx):
                group = c_rewards[j * g:(j + 1) * g]
                seen += 1
                pr = sum(group) / g
                # No-Positive-Resampling on the prompt's lifetime pass-rate history. The platform's buffer judges
                # the latest epoch and can recheck retired prompts; a loop run to its target ends well inside
                # one pass over the pool, where the two agree.
                attempts[i] = attempts.get(i, 0) + g
                successes[i] = successes.get(i, 0) + sum(group)
                if npr_threshold is not None and successes[i] / attempts[i] >= npr_threshold:
                    retired.add(i)
                if data_cfg.zero_variance_filter and pr in (0.0, 1.0):
                    continue
                prompts.append(chunk[j])
                enc += c_enc[j * g:(j + 1) * g]
                comps += c_comps[j * g:(j + 1) * g]
                old += c_old[j * g:(j + 1) * g]
                rewards += group
            if not data_cfg.zero_variance_filter:
                break
        rewards_t = torch.tensor(rewards)
        metrics = {}
        if prompts:
            policy.model.train()
            new, mask = policy.logprobs(enc, comps)
            old_t = torch.zeros_like(new)
            for r, lp in enumerate(old):
                old_t[r, : len(lp)] = torch.tensor(lp)
            gid = torch.arange(len(prompts)).repeat_interleave(g)
            adv = compute_advantages(rewards_t, gid, loss_cfg.advantage_norm)
            out = policy_loss(new, old_t, mask, adv, gid, loss_cfg)
            optim.zero_grad()
            out.loss.backward()
            metrics = out.metrics
            metrics["grad_norm"] = clip_grad(policy.model, opt_cfg)
            optim.step()
            if sampler is not policy:
                sampler.load(policy.model)
        sched.step()
        wall += time.monotonic() - t0
        if step % 10 == 0:
            print(
                f"#   step {step} train_pass {rewards_t.mean():.3f} groups {len(prompts)}/{seen} "
                f"retired {len(retired)} ratio {metrics.get('mean_ratio', float('nan')):.4f} "
                f"grad {metrics.get('grad_norm', float('nan')):.3f} wall {wall:.1f}s",
                flush=True,
            )
        last = step == args.steps or (args.max_seconds is not None and wall >= args.max_seconds)
        if step % args.eval_every == 0 or last:
            t_eval = time.monotonic()
            rate = record(step)
            recent = [r["val_pass_rate"] for r in rows[-args.target_window:]]
            if (args.target is not None and len(recent) == args.target_window
                    and sum(recent) / len(recent) >= args.target and reached is None):
                reached = (step, wall, tokens)
                print(f"# target {args.target} reached at step {step}: {wall:.1f}s, {tokens} generated tokens, "
                      f"{eval_wall:.1f}s of validation before it")
                break
            eval_wall += time.monotonic() - t_eval
        if last:
            break
    if fh is not None:
        fh.close()
    if args.target is not None and reached is None:
        print(f"# target {args.target} not reached (best {max(r['val_pass_rate'] for r in rows):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
