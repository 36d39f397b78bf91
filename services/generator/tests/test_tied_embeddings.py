"""A model whose lm_head is its embedding (tie_word_embeddings: SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B) samples
with the new lm_head after a weight update. The checkpoint and every update hold the embedding only; on CPU
vLLM's lm_head matmul runs on a copy made when the layer was processed, which its layer-wise reload skips for
a layer that received no tensors of its own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TOL = 1e-3  # float32 generator vs float32 HF forward
PROMPT = "12+7="
RESULT = "tied-engine-result: "


def _tied_copy(src: Path, dst: Path) -> Path:
    """`src` (the tiny model) as a tied model: config says so, the checkpoint drops lm_head.weight."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (dst / "config.json").write_text(json.dumps(config))
    for f in dst.glob("*.safetensors"):
        state = load_file(f)
        state.pop("lm_head.weight", None)
        save_file(state, f, metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def tied(tiny_models, tmp_path_factory):
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("tied")
    dirs = [_tied_copy(p, root / f"m{i}") for i, p in enumerate(tiny_models)]
    hf = [LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval() for d in dirs]
    for m in hf:
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr()
    return dirs, hf


def _sample_through_updates(model_dirs: list[str]) -> list[list[dict]]:
    """In its own process (vLLM's engines share process-wide parallel state, which one engine's shutdown tears
    down under the session engine of the other generator tests): start on model_dirs[0], sample, then load each
    further directory's weights as an update and sample again."""
    import asyncio

    from safetensors.torch import load_file

    from scalerl_generator.engine import GenerationEngine

    async def run() -> list[list[dict]]:
        eng = GenerationEngine(model_dirs[0], seed=0, max_model_len=128, block_size=32)
        await eng.start()
        prompt = eng.tokenizer(PROMPT)["input_ids"]
        phases = []
        try:
            for version, model_dir in enumerate(model_dirs):
                if version:
                    state = {}
                    for f in sorted(Path(model_dir).glob("*.safetensors")):
                        state.update(load_file(f))
                    assert "lm_head.weight" not in state
                    await eng.update_weights(state, version, kv_cache="recompute")
                got = await eng.generate(prompt, 4, max_tokens=40, ignore_eos=True, sample_seed=10 + version)
                phases.append([{"prompt": prompt, "token_ids": c.token_ids, "logprobs": c.logprobs} for c in got])
        finally:
            await eng.shutdown()
        return phases

    return asyncio.run(run())


@torch.no_grad()
def _gap(model, completions: list[dict]) -> float:
    gaps = []
    for c in completions:
        prompt, out = c["prompt"], c["token_ids"]
        logits = model(input_ids=torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1]
        ref = logits.double().log_softmax(-1).gather(-1, torch.tensor(out)[:, None])[:, 0]
        gaps.append((ref - torch.tensor(c["logprobs"], dtype=torch.float64)).abs().max().item())
    return max(gaps)


def test_a_tied_lm_head_follows_each_update(tied):
    dirs, hf = tied
    order = [0, 1, 0]  # start on model 0, update to 1, then back: each update must land in the lm_head
    proc = subprocess.run([sys.executable, __file__, *(str(dirs[i]) for i in order)], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    phases = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith(RESULT))[len(RESULT):])
    assert _gap(hf[0], phases[0]) < TOL
    for version, i in enumerate(order[1:], start=1):
        gap, other = _gap(hf[i], phases[version]), _gap(hf[1 - i], phases[version])
        print(f"version {version}: |vLLM - HF| {gap:.2e} against the model sent, {other:.2e} against the other")
        assert other > 100 * TOL  # the two models differ, so a stale lm_head would show
        assert gap < TOL


if __name__ == "__main__":
    print(RESULT + json.dumps(_sample_through_updates(sys.argv[1:])))
