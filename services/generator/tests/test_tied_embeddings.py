"""A model whose lm_head is its embedding (tie_word_embeddings: SmolLM2, Qwen2.5-0.5B, Llama-3.2-1B) samples
with the new lm_head after a weight update. The checkpoint and every update hold the embedding only; on CPU
vLLM's lm_head matmul runs on a copy made when the layer was processed, which its layer-wise reload skips for
a layer that received no tensors of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

TOL = 1e-3  # float32 generator vs float32 HF forward


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


@pytest.fixture(scope="module")
def tied_engine(tied, loop):
    from scalerl_generator.engine import GenerationEngine

    eng = GenerationEngine(str(tied[0][0]), seed=0, max_model_len=128, block_size=32)
    loop.run(eng.start(), timeout=600)
    yield eng
    loop.run(eng.shutdown(), timeout=120)


@torch.no_grad()
def _gap(model, prompt: list[int], completions) -> float:
    gaps = []
    for c in completions:
        logits = model(input_ids=torch.tensor([prompt + c.token_ids])).logits[0, len(prompt) - 1:-1]
        ref = logits.double().log_softmax(-1).gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]
        gaps.append((ref - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max().item())
    return max(gaps)


def test_a_tied_lm_head_follows_each_update(tied, tied_engine, loop):
    from safetensors.torch import load_file

    dirs, hf = tied
    prompt = tied_engine.tokenizer("12+7=")["input_ids"]

    def sample(seed: int):
        return loop.run(tied_engine.generate(prompt, 4, max_tokens=40, ignore_eos=True, sample_seed=seed))

    assert _gap(hf[0], prompt, sample(1)) < TOL
    for version, i in ((1, 1), (2, 0)):  # there and back: each update must land in the lm_head
        state = {}
        for f in sorted(dirs[i].glob("*.safetensors")):
            state.update(load_file(f))
        assert "lm_head.weight" not in state
        loop.run(tied_engine.update_weights(state, version, kv_cache="recompute"))
        got = sample(10 + version)
        gap, other = _gap(hf[i], prompt, got), _gap(hf[1 - i], prompt, got)
        print(f"version {version}: |vLLM - HF| {gap:.2e} against the model sent, {other:.2e} against the other")
        assert other > 100 * TOL  # the two models differ, so a stale lm_head would show
        assert gap < TOL
