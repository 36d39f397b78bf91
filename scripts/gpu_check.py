#!/usr/bin/env python
"""`make gpu-check`: what the platform does on one CUDA GPU, measured in one run (<= 8 minutes on one H200).

Sections (each runs even when an earlier one failed; its error is recorded):

* learner: Trainer.step with a bf16 body and the FP32 LM head vs a bare torch step (bf16 forward, full float32
  log-softmax, same loss, AdamW) on a 32k-vocabulary Llama; step times, peak memory, and the FP32 head's
  log-prob gap to a float64 head next to the bf16 head's.
* fsdp: ``torchrun --nproc_per_node 1 -m scalerl_learner.fsdp_run`` (FSDP2, NCCL, world size 1): step times.
* vllm: ``bench/generator_bench.py`` (in-flight weight-update pause, generation tokens/s vs offline vLLM).
* weights: a version held in GPU memory (1 GiB bf16 by default). The learner's side of every host transport
  (grpc, tcp, filesystem): the encoding into reused page-locked staging buffers, then the xxh3 chunk hashes,
  against a bare copy into pinned host memory and against the former encoding (``safetensors.torch.save`` of
  ``.cpu()`` copies); and the ``torch_distributed`` transport publishing on NCCL. One GPU holds
  one NCCL rank (NCCL refuses two ranks on one device), so that group has world size 1: it proves the NCCL path
  (group from the TCPStore, header, names, the flat buffer built on the GPU) and times the publisher's side.

Writes JSON to ``--out`` or ``$OUT/gpu_check.json``. Needs CUDA torch and a CUDA vLLM build; exits with status
2 and says so when CUDA is absent.

    python scripts/gpu_check.py [--out gpu_check.json] [--sections learner fsdp vllm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("learner", "fsdp", "vllm", "weights")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="JSON result path (default: $OUT/gpu_check.json)")
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--learner-steps", type=int, default=5)
    ap.add_argument("--section-timeout-s", type=int, default=200, help="per subprocess section")
    ap.add_argument("--weights-mib", type=int, default=1024, help="size of the version in the weights section")
    return ap.parse_args(argv)


def output_path(args: argparse.Namespace, env: dict | None = None) -> Path:
    env = os.environ if env is None else env
    if args.out is not None:
        return args.out
    if env.get("OUT"):
        return Path(env["OUT"]) / "gpu_check.json"
    return Path("gpu_check.json")


def write_result(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, default=str))
    os.replace(tmp, path)


def cuda_problem() -> str | None:
    """Why this machine cannot run the check, or None."""
    try:
        import torch
    except ImportError as err:  # pragma: no cover - torch is a dependency
        return f"torch is not importable: {err}"
    if not torch.cuda.is_available():
        return (f"CUDA is not available (torch {torch.__version__}, built for CUDA {torch.version.cuda}): "
                "make gpu-check needs an NVIDIA GPU and CUDA builds of torch and vLLM")
    return None


def environment() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)}
    try:
        import vllm

        info["vllm"] = vllm.__version__
    except Exception as err:  # noqa: BLE001 - recorded, the vllm section will fail with it
        info["vllm"] = f"not importable: {err}"
    return info


# ---- learner -----------------------------------------------------------------------------------------------
def _wide_model(path: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=32_000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).save_pretrained(path)
    return path


LEARNER_VARIANTS = {
    "bf16_lm_head": {"model": {"fp32_lm_head": False}},
    "logprob_chunk_8192": {"learner": {"logprob_chunk_tokens": 8192}},
    "micro_batch_131072": {"learner": {"micro_batch_tokens": 131_072}},
    "micro_batch_131072_chunk_8192": {"learner": {"micro_batch_tokens": 131_072, "logprob_chunk_tokens": 8192}},
}
"""Recipe changes timed beside the defaults (same batch): the FP32 head, the head's chunk, the micro-batch."""


def _bare_step(model, optimizer, batch) -> None:
    """bf16 forward, the full [N, L, V] float32 log-softmax, CISPO-like loss, AdamW: the floor to compare to."""
    import torch

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logprobs = torch.log_softmax(logits, -1)[:, :-1].gather(2, batch.input_ids[:, 1:, None]).squeeze(-1)
    width = batch.old_logprobs.shape[1]
    index = (batch.completion_start[:, None] - 1 + torch.arange(width, device=logits.device)[None, :]).clamp(
        max=batch.input_ids.shape[1] - 2)
    new = logprobs.gather(1, index)
    mask = batch.loss_mask.float()
    adv = batch.rewards - batch.rewards.mean()
    adv = adv / (adv.std() + 1e-8)
    ratio = torch.exp(new.detach() - batch.old_logprobs).clamp(max=4.0)
    loss = -(ratio * adv[:, None] * new * mask).sum() / mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def _timed(fn, steps: int) -> tuple[list[float], float]:
    import torch

    fn()  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return times, torch.cuda.max_memory_allocated() / 2**30


def learner_section(args, tmp: Path) -> dict:
    import statistics

    import torch
    from transformers import AutoModelForCausalLM

    from scalerl.recipe import Recipe
    from scalerl_learner.batch import LogprobOptions, build_batch, output_logprobs, select_rows
    from scalerl_learner.fsdp_run import synthetic_groups
    from scalerl_learner.trainer import Trainer

    cuda = torch.device("cuda")
    path = _wide_model(tmp / "wide")
    groups = synthetic_groups(0, prompts=32, per_prompt=8, completion_tokens=256, vocab=32_000)
    batch = build_batch(groups, 0)
    recipe = Recipe(model={"dtype": "bfloat16"}, learner={"device": "cuda"},
                    optimizer={"lr": 1e-6, "warmup_steps": 0})
    out: dict = {"params_m": None, "samples": len(batch.rewards), "loss_tokens": batch.num_tokens}

    def load():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).to(cuda)
        model.train()
        return model

    def platform_step(model, recipe) -> tuple[float, float]:
        """Median Trainer.step seconds and peak GiB; the trainer is freed on return."""
        trainer = Trainer(model, recipe, pad_id=0, device=cuda)
        times, peak = _timed(lambda: trainer.step(groups, 0), args.learner_steps)
        return statistics.median(times), round(peak, 2)

    model = load()
    out["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 1)
    with torch.no_grad():  # precision on the GPU: FP32 head vs bf16 head against a float64 head
        small = select_rows(batch, torch.arange(16), cuda)
        fp32 = output_logprobs(model, small, LogprobOptions(fp32_lm_head=True))
        plain = output_logprobs(model, small, LogprobOptions(fp32_lm_head=False))
        hidden = model.model(input_ids=small.input_ids, attention_mask=small.attention_mask).last_hidden_state
        rows, cols = small.loss_mask.nonzero(as_tuple=True)
        pos = small.completion_start[rows] + cols
        ref = torch.log_softmax(hidden[rows, pos - 1].double() @ model.lm_head.weight.double().T, -1).gather(
            1, small.input_ids[rows, pos][:, None]).squeeze(1)
        out["fp32_head_max_gap"] = (fp32[rows, cols].double() - ref).abs().max().item()
        out["bf16_head_max_gap"] = (plain[rows, cols].double() - ref).abs().max().item()
    out["platform_step_s_median"], out["platform_peak_gib"] = platform_step(model, recipe)
    del model
    torch.cuda.empty_cache()

    out["variants"] = {}  # where the time goes: one knob changed at a time from the defaults
    for name, change in LEARNER_VARIANTS.items():
        variant = recipe.model_copy(update={key: getattr(recipe, key).model_copy(update=value)
                                            for key, value in change.items()})
        step_s, peak = platform_step(load(), variant)
        out["variants"][name] = {"step_s_median": step_s, "peak_gib": peak}
        torch.cuda.empty_cache()

    bare = load()
    opt = torch.optim.AdamW(bare.parameters(), lr=1e-6, eps=1e-15, weight_decay=0.01)
    on_gpu = select_rows(batch, torch.arange(len(batch.rewards)), cuda)
    on_gpu.rewards = on_gpu.rewards.to(cuda)
    times, peak = _timed(lambda: _bare_step(bare, opt, on_gpu), args.learner_steps)
    out["bare_step_s_median"] = statistics.median(times)
    out["bare_peak_gib"] = round(peak, 2)
    out["step_ratio_platform_over_bare"] = out["platform_step_s_median"] / out["bare_step_s_median"]
    out["tokens_per_s"] = batch.num_tokens / out["platform_step_s_median"]
    return out


# ---- subprocess sections -------------------------------------------------------------------------------------
def fsdp_section(args, tmp: Path) -> dict:
    from scalerl.ports import unused_port

    model = _wide_model(tmp / "wide-fsdp")
    out = tmp / "fsdp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", f"--master_port={unused_port()}",
           "-m", "scalerl_learner.fsdp_run", "--model", str(model), "--out", str(out), "--steps", "6",
           "--prompts", "16", "--per-prompt", "8", "--completion-tokens", "256", "--dtype", "bfloat16",
           "--recipe-json", json.dumps({"learner": {"device": "cuda"}})]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.section_timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"torchrun exited {done.returncode}: {done.stderr[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    steps = result["steps"][1:]  # first step: warm-up
    seconds = sorted(s["seconds"] for s in steps)[len(steps) // 2]
    return {"world_size": result["world_size"], "step_s_median": seconds,
            "tokens_per_s": steps[0]["tokens"] / seconds, "losses": [s["loss"] for s in result["steps"]]}


def vllm_section(args, tmp: Path) -> dict:
    cmd = [sys.executable, str(ROOT / "bench" / "generator_bench.py"), "--prompts", "32", "--n", "4",
           "--max-tokens", "100", "--dtype", "bfloat16"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.section_timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"generator_bench exited {done.returncode}: {done.stderr[-3000:]}")
    text = done.stdout
    return json.loads(text[text.rindex("\n{") + 1 if "\n{" in text else text.index("{"):])


# ---- weights -------------------------------------------------------------------------------------------------
def _median_time(fn, reps: int = 5) -> float:
    import statistics

    return statistics.median(_timed(fn, reps)[0])


def weights_section(args, tmp: Path) -> dict:
    import torch

    from scalerl.ports import unused_port
    from scalerl.weights.chunked import ChunkedVersion
    from scalerl.weights.codec import StagingBuffers
    from scalerl.weights.collective import TorchDistributedTransport

    tensors, width = 32, 1024
    rows = args.weights_mib * 2**20 // 2 // tensors // width
    gen = torch.Generator(device="cuda").manual_seed(0)
    state = {f"layers.{i}.weight": torch.randn(rows, width, dtype=torch.bfloat16, device="cuda", generator=gen)
             for i in range(tensors)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    gib = nbytes / 2**30
    out: dict = {"version_gib": round(gib, 3), "tensors": tensors}

    flat = torch.cat([t.view(-1) for t in state.values()])
    pinned = torch.empty(flat.numel(), dtype=flat.dtype, pin_memory=True)
    out["d2h_pinned_s"] = _median_time(lambda: pinned.copy_(flat))
    out["d2h_pageable_s"] = _median_time(lambda: flat.cpu())
    del flat, pinned

    from safetensors.torch import save

    # the encoding the transports used before (a pageable .cpu() copy per tensor, then safetensors.save)
    out["safetensors_save_s"] = _median_time(lambda: save({k: v.cpu() for k, v in state.items()}))
    staging, kept = StagingBuffers(count=2), [None]

    def encode() -> None:  # what the grpc, tcp and filesystem transports do with GPU tensors, version after version
        with staging.encoded(state, keep=kept[0]) as blob:
            kept[0] = blob

    out["staged_encode_s"] = _median_time(encode)
    out["chunk_hashes_s"] = _median_time(lambda: ChunkedVersion.from_blob("gpu-check", 1, kept[0], 2**20))
    out["host_publish_prep_s"] = out["staged_encode_s"] + out["chunk_hashes_s"]
    out["host_publish_prep_over_pinned_copy"] = out["host_publish_prep_s"] / out["d2h_pinned_s"]
    out["safetensors_save_over_staged_encode"] = out["safetensors_save_s"] / out["staged_encode_s"]
    del staging, kept

    transport = TorchDistributedTransport(f"127.0.0.1:{unused_port()}", 1, backend="nccl", timeout_s=60)
    version = [0]

    def publish() -> None:
        version[0] += 1
        transport.publish("gpu-check", version[0], state)

    out["nccl_publish_s"] = _median_time(publish)
    out["nccl_backend"] = type(transport._pg).__name__
    transport.close()
    for key in ("d2h_pinned_s", "d2h_pageable_s", "safetensors_save_s", "staged_encode_s", "chunk_hashes_s",
                "nccl_publish_s"):
        out[key.removesuffix("_s") + "_gib_per_s"] = round(gib / out[key], 2)
    return out


RUNNERS = {"learner": learner_section, "fsdp": fsdp_section, "vllm": vllm_section, "weights": weights_section}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = output_path(args)
    result: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sections": {}}
    problem = cuda_problem()
    if problem is not None:
        result["error"] = problem
        write_result(path, result)
        print(f"gpu-check: {problem}", file=sys.stderr)
        return 2
    result["environment"] = environment()
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sections:
            started = time.perf_counter()
            try:
                section = RUNNERS[name](args, Path(tmp))
            except Exception as err:  # noqa: BLE001 - recorded; the other sections still run
                failed = True
                section = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc(limit=5)}
            section["wall_s"] = round(time.perf_counter() - started, 1)
            result["sections"][name] = section
            write_result(path, result)  # what was measured so far survives a later timeout
            print(f"gpu-check {name}: {json.dumps(section, default=str)[:2000]}", flush=True)
    print(f"gpu-check: wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
