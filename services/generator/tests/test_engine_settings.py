"""vLLM's memory and parallelism settings come from Settings (SCALERL_ENGINE__*), not hard-wired in the engine."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scalerl.settings import Settings
from scalerl_generator.engine import GiB, GenerationEngine


def engine_args(env: dict, monkeypatch) -> object:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    return GenerationEngine("/models/m", max_model_len=4096, **settings.engine.model_dump()).engine_args()


def test_defaults_keep_the_cpu_engine(monkeypatch):
    args = engine_args({}, monkeypatch)
    assert args.tensor_parallel_size == 1 and args.enforce_eager is True
    assert args.kv_cache_memory_bytes == 1 * GiB


def test_gpu_settings_reach_vllm(monkeypatch):
    args = engine_args({"SCALERL_ENGINE__TENSOR_PARALLEL_SIZE": "4", "SCALERL_ENGINE__GPU_MEMORY_UTILIZATION": "0.85",
                        "SCALERL_ENGINE__KV_CACHE_GIB": "0", "SCALERL_ENGINE__ENFORCE_EAGER": "false",
                        "SCALERL_ENGINE__MAX_NUM_SEQS": "512"}, monkeypatch)
    assert args.tensor_parallel_size == 4
    assert args.gpu_memory_utilization == 0.85
    assert args.kv_cache_memory_bytes is None  # sized by vLLM from gpu_memory_utilization
    assert args.enforce_eager is False  # CUDA graphs
    assert args.max_num_seqs == 512
    assert args.max_model_len == 4096  # the recipe's


@pytest.mark.parametrize("key,value", [("TENSOR_PARALLEL_SIZE", "0"), ("GPU_MEMORY_UTILIZATION", "1.5"),
                                       ("KV_CACHE_GIB", "-1")])
def test_bad_engine_settings_name_the_field(monkeypatch, key, value):
    monkeypatch.setenv(f"SCALERL_ENGINE__{key}", value)
    with pytest.raises(ValidationError) as err:
        Settings()
    assert err.value.errors()[0]["loc"] == ("engine", key.lower())
