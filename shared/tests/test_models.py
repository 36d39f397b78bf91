"""The builtin tiny model: deterministic offline build, a round-tripping tokenizer, HF-loadable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scalerl.recipe import INTERRUPTION_PHRASE
from scalerl.testing import sharing_models
from scalerl.models import (
    BUILTIN_PREFIX,
    FORMAT_VERSION,
    SFT_PROBE_EVERY,
    TINY_NAME,
    build_tokenizer,
    build_tiny_model,
    resolve_model_path,
)

SFT_STEPS = 3


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("tiny")
    a = build_tiny_model(root / "a", seed=0, sft_steps=SFT_STEPS)
    return a, build_tiny_model(root / "b", seed=0, sft_steps=SFT_STEPS)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def test_same_seed_same_files(built):
    a, b = built
    fa, fb = _files(a), _files(b)
    assert "model.safetensors" in fa and "tokenizer.json" in fa and "config.json" in fa
    assert fa.keys() == fb.keys()
    for name in fa:
        assert fa[name] == fb[name], name
    meta = json.loads(fa["scalerl_tiny.json"])
    assert meta["format_version"] == FORMAT_VERSION and meta["sft_steps"] == SFT_STEPS


def test_warm_up_stops_at_the_greedy_target(tmp_path):
    # the probe is checked every SFT_PROBE_EVERY steps: a target of 0 is met at the first check, 1.01 never
    early = json.loads((build_tiny_model(tmp_path / "e", sft_steps=25, target_greedy=0.0)
                        / "scalerl_tiny.json").read_text())
    assert (early["sft_steps"], early["sft_max_steps"]) == (SFT_PROBE_EVERY, 25)
    full = json.loads((build_tiny_model(tmp_path / "f", sft_steps=25, target_greedy=1.01)
                       / "scalerl_tiny.json").read_text())
    assert full["sft_steps"] == 25 and 0 <= full["probe_greedy_accuracy"] < 1.01


def _sampled_pass_rate(model, probe, samples: int = 32) -> float:
    prompts = [row[: int(m.nonzero()[0]) + 1] for row, m in zip(probe.ids, probe.mask)]  # prompt, up to its answer
    answers = [row[int(m.nonzero()[0]) + 1: int(m.nonzero()[-1]) + 2] for row, m in zip(probe.ids, probe.mask)]
    torch.manual_seed(0)
    hits = 0
    for prompt, answer in zip(prompts, answers):
        out = model.generate(prompt[None].repeat(samples, 1), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=len(answer), pad_token_id=0)[:, len(prompt):]
        hits += int((out == answer).all(dim=1).sum())
    return hits / (samples * len(prompts))


def test_the_cooled_model_samples_the_target_pass_rate_and_keeps_its_greedy_answers(tmp_path):
    """RL starts from the saved model's pass rate under sampling at T = 1: the cooling baked into the LM head
    must give exactly the target there (a greedy probe did not pin it: two machines at the same greedy 0.50
    sampled 0.27 and 0.19), and must leave the greedy answers, the ceiling RL can sharpen towards, as they were.
    The model checked is the builtin one every job and test uses (built once per checkout, shared with them)."""
    from transformers import LlamaForCausalLM

    from scalerl.models import SFT_TARGET_PASS_RATE, _Probe

    path = resolve_model_path(f"{BUILTIN_PREFIX}{TINY_NAME}", sharing_models(tmp_path))
    meta = json.loads((path / "scalerl_tiny.json").read_text())
    model = LlamaForCausalLM.from_pretrained(path)
    probe = _Probe(build_tokenizer(), seed=0)
    assert meta["target_pass_rate"] == SFT_TARGET_PASS_RATE
    assert meta["lm_head_cooling"] > 1.5  # the warm-up learned enough for the cooling to matter
    assert probe.pass_rate(model) == pytest.approx(SFT_TARGET_PASS_RATE, abs=1e-3)
    assert probe.greedy_accuracy(model) == pytest.approx(meta["probe_greedy_accuracy"], abs=1e-4)
    assert meta["probe_greedy_accuracy"] > 0.5
    assert abs(_sampled_pass_rate(model, probe) - SFT_TARGET_PASS_RATE) < 0.03  # 8192 samples: sd ~0.004


def test_cooling_is_a_temperature_found_by_bisection(tmp_path):
    from transformers import LlamaForCausalLM

    from scalerl.models import _Probe

    model = LlamaForCausalLM.from_pretrained(build_tiny_model(tmp_path / "q", sft_steps=3))
    probe = _Probe(build_tokenizer(), seed=0)
    untrained = probe.pass_rate(model)
    assert probe.cooling_for(model, untrained + 0.01) == 1.0  # never heats a model that samples below the target
    assert probe.pass_rate(model, probe.cooling_for(model, untrained / 2)) == pytest.approx(untrained / 2, rel=1e-3)


def test_different_seed_different_weights(tmp_path, built):
    other = build_tiny_model(tmp_path / "c", seed=1, sft_steps=SFT_STEPS)
    assert (other / "model.safetensors").read_bytes() != (built[0] / "model.safetensors").read_bytes()


@pytest.mark.parametrize("text", ["47+85=", "132", INTERRUPTION_PHRASE, "Mixed CASE, punctuation: {}[]~!@#$%^&*()_ 0"])
def test_tokenizer_round_trips(text):
    tok = build_tokenizer()
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.unk_token_id not in ids
    assert len(ids) == len(text) + 1  # one token per character
    assert tok.decode(ids, skip_special_tokens=True) == text


def test_loads_with_auto_classes(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = built[0]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.head_dim in (32, 64)  # vLLM CPU attention
    assert tok.decode(tok(INTERRUPTION_PHRASE)["input_ids"], skip_special_tokens=True) == INTERRUPTION_PHRASE
    ids = torch.tensor([tok("12+3=")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()
    out = model.generate(
        ids, max_new_tokens=4, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    assert out.shape[1] <= ids.shape[1] + 4


def test_resolve_model_path_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.path"):
        resolve_model_path(str(tmp_path / "missing"), tmp_path)
    with pytest.raises(ValueError, match="model.path"):
        resolve_model_path(BUILTIN_PREFIX + "no-such-model", tmp_path)


def test_resolve_model_path_local_dir(built, tmp_path):
    assert resolve_model_path(str(built[0]), tmp_path) == built[0]


def test_resolve_builtin_uses_cache(built, tmp_path):
    # A cached build is reused as is (no warm-up run in the test).
    target = tmp_path / "models" / f"{TINY_NAME}-v{FORMAT_VERSION}"
    target.parent.mkdir(parents=True)
    import shutil

    shutil.copytree(built[0], target)
    assert resolve_model_path(BUILTIN_PREFIX + TINY_NAME, tmp_path) == target
