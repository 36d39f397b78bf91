"""Fixtures for the generator tests: two tiny models, one vLLM engine for the session, HF references.

The engine's coroutines run on a dedicated event-loop thread (results come back to the loop that started
the engine), so tests stay synchronous and need no pytest-asyncio.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scalerl_generator.testing import LoopThread

# Small KV cache on CPU (GiB); vLLM reads this at engine build time.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _state(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(f))
    return state


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> tuple[Path, Path]:
    """The engine's starting model (seed 0) and a different model of the same shape (seed 1)."""
    from scalerl.models import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_model(root / "m0", seed=0, sft_steps=20), build_tiny_model(root / "m1", seed=1, sft_steps=10)


@pytest.fixture(scope="session")
def states(tiny_models) -> tuple[dict, dict]:
    """Each model's named tensors (what a weight transport hands the engine)."""
    return _state(tiny_models[0]), _state(tiny_models[1])


@pytest.fixture(scope="session")
def hf_models(tiny_models):
    import torch
    from transformers import LlamaForCausalLM

    return tuple(LlamaForCausalLM.from_pretrained(p, dtype=torch.float32, attn_implementation="eager").eval()
                 for p in tiny_models)


@pytest.fixture(scope="session")
def loop():
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="session")
def engine(tiny_models, loop):
    from scalerl_generator.engine import GenerationEngine

    # 32-token KV blocks: the CPU default (128) is the whole context here, so nothing would be prefix-cached.
    # One engine per test process: vLLM's in-process engines share global parallel state.
    eng = GenerationEngine(str(tiny_models[0]), seed=0, max_model_len=128, block_size=32)
    loop.run(eng.start(), timeout=600)
    yield eng
    loop.run(eng.shutdown(), timeout=120)


@pytest.fixture
def base_engine(engine, loop, states):
    """The session engine, put back on the seed-0 weights (under a fresh version label) after the test."""
    yield engine
    loop.run(engine.update_weights(states[0], engine.current_version + 1, kv_cache="recompute"))
