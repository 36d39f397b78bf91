"""Gradient accumulation over micro-batches of whole samples gives the full-batch loss and gradient: 1, 2 and 7
micro-batches against one forward/backward of the whole batch, for every aggregation, CISPO and GSPO, with
batch advantage normalisation (computed over the whole batch before any micro-batch)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from scalerl.models import build_tiny_model
from scalerl.recipe import Recipe
from scalerl.v1 import common_pb2
from scalerl_learner.batch import build_batch, micro_batches, output_logprobs
from scalerl_learner.losses import compute_advantages, policy_loss
from scalerl_learner.trainer import StepInterrupted, Trainer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", sft_steps=30)


def scored_groups(prompts: int = 5, per_prompt: int = 3, seed: int = 0) -> list[common_pb2.ScoredGroup]:
    """Prompts and completions of different lengths, some injected (masked) tokens, one zero-variance group."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for p in range(prompts):
        prompt = [1] + torch.randint(4, 90, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
        completions = []
        for i in range(per_prompt):
            n = int(torch.randint(1, 14, (1,), generator=g))
            tokens = torch.randint(4, 90, (n,), generator=g).tolist()
            mask = [bool(m) for m in (torch.rand(n, generator=g) > 0.15).tolist()]
            old = (-torch.rand(n, generator=g) * 4).tolist()
            reward = 0.0 if p == 0 else float(torch.randint(0, 2, (1,), generator=g))
            completions.append(common_pb2.ScoredCompletion(completion=common_pb2.Completion(
                token_ids=tokens, logprobs=old, loss_mask=mask,
                versions=[common_pb2.VersionSpan(version=0, start=0, end=n)]), reward=reward))
        out.append(common_pb2.ScoredGroup(job_id="j", group_id=str(p), prompt_token_ids=prompt,
                                          completions=completions))
    return out


def budget_for(batch, parts: int) -> int:
    """The largest token budget that splits `batch` into exactly `parts` micro-batches."""
    total = int(batch.attention_mask.shape[0] * batch.attention_mask.shape[1])
    for budget in range(total, 0, -1):
        if len(micro_batches(batch, budget)) == parts:
            return budget
    raise AssertionError(f"no budget gives {parts} micro-batches")


LOSSES = [{"type": "cispo", "eps_max": 1.5}, {"type": "gspo", "gspo_clip": 10.0}]


@pytest.mark.parametrize("aggregation", ["prompt", "sample", "token"])
@pytest.mark.parametrize("loss", LOSSES, ids=["cispo", "gspo"])
def test_micro_batches_give_the_full_batch_loss_and_gradient(model_dir, loss, aggregation):
    recipe = Recipe(loss={**loss, "aggregation": aggregation, "advantage_norm": "batch"},
                    generation={"temperature": 0.7, "top_p": 0.9})
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model.train()
    batch = build_batch(scored_groups(), pad_id=0)
    trainer = Trainer(model, recipe, pad_id=0)

    # Reference: the whole batch in one forward and one backward, the loss as policy_loss defines it.
    new = output_logprobs(model, batch, trainer.logprob_options)
    adv = compute_advantages(batch.rewards, batch.group_index, recipe.loss.advantage_norm)
    ref = policy_loss(new, batch.old_logprobs, batch.loss_mask, adv, batch.group_index, recipe.loss)
    model.zero_grad()
    ref.loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert sum(g.norm() for g in ref_grads.values()) > 0

    for parts in (1, 2, 7):
        budget = budget_for(batch, parts)
        got, n = trainer.accumulate(batch, micro_batch_tokens=budget)
        assert n == parts
        assert abs(got.loss.item() - ref.loss.item()) <= 1e-5 * abs(ref.loss.item())
        for name, p in model.named_parameters():
            err = (p.grad - ref_grads[name]).norm() / ref_grads[name].norm().clamp(min=1e-30)
            assert err <= 1e-5, (name, budget, err.item())


def test_seven_micro_batches_and_the_token_budget():
    batch = build_batch(scored_groups(prompts=7, per_prompt=2), pad_id=0)
    lengths = batch.attention_mask.sum(1)
    longest = int(lengths.max())
    assert len(micro_batches(batch, 1)) == 14  # a budget below every sample: one sample each
    for budget in (1, 10, longest, 3 * longest, 1000):
        parts = micro_batches(batch, budget)
        assert sorted(torch.cat(parts).tolist()) == list(range(len(lengths)))  # every sample exactly once
        for rows in parts:
            assert len(rows) == 1 or len(rows) * int(lengths[rows].max()) <= budget


def test_seven_micro_batches_match_one(model_dir):
    recipe = Recipe(loss={"type": "cispo", "aggregation": "prompt"})
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    batch = build_batch(scored_groups(prompts=7, per_prompt=2, seed=3), pad_id=0)
    trainer = Trainer(model, recipe, pad_id=0)
    one, n1 = trainer.accumulate(batch, micro_batch_tokens=10**6)
    g1 = [p.grad.clone() for p in model.parameters()]
    seven, n7 = trainer.accumulate(batch, micro_batch_tokens=budget_for(batch, 7))
    assert (n1, n7) == (1, 7)
    assert abs(one.loss.item() - seven.loss.item()) <= 1e-5 * abs(one.loss.item())
    for a, p in zip(g1, model.parameters()):
        assert (p.grad - a).norm() <= 1e-5 * a.norm().clamp(min=1e-30)


def test_activation_checkpointing_changes_memory_not_the_gradient(model_dir):
    batch = build_batch(scored_groups(seed=5), pad_id=0)
    grads = []
    for ckpt in (False, True):
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        model.train()
        trainer = Trainer(model, Recipe(learner={"activation_checkpointing": ckpt}), pad_id=0)
        assert model.is_gradient_checkpointing == ckpt
        trainer.accumulate(batch)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert (grads[0] - grads[1]).norm() <= 1e-5 * grads[0].norm()


def test_a_set_stop_abandons_the_step_between_micro_batches(model_dir):
    import threading

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(model, Recipe(learner={"micro_batch_tokens": 1}), pad_id=0)
    stop = threading.Event()
    stop.set()
    with pytest.raises(StepInterrupted):
        trainer.step(scored_groups(), learner_version=0, stop=stop)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())
