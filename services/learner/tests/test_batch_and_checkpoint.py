"""Scored groups → tensors, learner log-probs against a plain HF forward pass, checkpoints and resume."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from scalerl.recipe import OptimizerConfig
from scalerl.v1 import common_pb2
from scalerl_learner.batch import LogprobOptions, build_batch, output_logprobs, token_versions
from scalerl_learner.checkpoint import latest_checkpoint, restore_trainer_state, save_checkpoint
from scalerl_learner.optim import build_optimizer, build_scheduler
from scalerl.models import build_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", sft_steps=5)


def completion(tokens, logprobs, spans, mask=None):
    return common_pb2.Completion(token_ids=tokens, logprobs=logprobs,
                                 loss_mask=mask if mask is not None else [True] * len(tokens),
                                 versions=[common_pb2.VersionSpan(version=v, start=s, end=e) for v, s, e in spans])


def group(prompt_ids, completions, rewards):
    return common_pb2.ScoredGroup(job_id="j", group_id="g", prompt_token_ids=prompt_ids, completions=[
        common_pb2.ScoredCompletion(completion=c, reward=r, grade_status=common_pb2.GRADE_STATUS_GRADED)
        for c, r in zip(completions, rewards)])


def test_token_versions_expand_spans():
    c = completion([5, 6, 7, 8], [0.0] * 4, [(3, 0, 1), (4, 1, 4)])
    assert token_versions(c) == [3, 4, 4, 4]


def test_build_batch_pads_and_keeps_bookkeeping():
    g1 = group([1, 10, 11], [completion([20, 21], [-0.1, -0.2], [(0, 0, 2)]),
                             completion([22], [-0.3], [(1, 0, 1)])], [1.0, 0.0])
    g2 = group([1, 12], [completion([23, 24, 25], [-0.4, 0.0, -0.6], [(2, 0, 3)], [True, False, True])], [1.0])
    b = build_batch([g1, g2], pad_id=0)
    assert b.input_ids.tolist() == [[1, 10, 11, 20, 21], [1, 10, 11, 22, 0], [1, 12, 23, 24, 25]]
    assert b.completion_start.tolist() == [3, 3, 2]
    assert b.loss_mask.tolist() == [[True, True, False], [True, False, False], [True, False, True]]
    assert b.token_versions.tolist() == [[0, 0, -1], [1, -1, -1], [2, 2, 2]]
    assert b.group_index.tolist() == [0, 0, 1] and b.rewards.tolist() == [1.0, 0.0, 1.0]
    assert b.old_logprobs[2].tolist() == pytest.approx([-0.4, 0.0, -0.6])
    assert b.num_tokens == 5


@pytest.mark.parametrize("chunk_tokens", [1, 3, 1024])
def test_output_logprobs_match_a_plain_forward_pass(model_dir, chunk_tokens):
    """Chunked over output tokens, at loss positions only: the same log-probs as one full forward pass
    (0 where the loss mask is off)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tok("12+34=")["input_ids"], tok("7+8=")["input_ids"]]
    outs = [tok("46", add_special_tokens=False)["input_ids"] + [2], tok("15", add_special_tokens=False)["input_ids"]]
    masks = [[True, False, True], [True, True]]
    groups = [group(p, [completion(o, [0.0] * len(o), [(0, 0, len(o))], m)], [1.0])
              for p, o, m in zip(prompts, outs, masks)]
    batch = build_batch(groups, pad_id=tok.pad_token_id)
    got = output_logprobs(model, batch, LogprobOptions(chunk_tokens=chunk_tokens))
    got.sum().backward()  # through the checkpointed chunks
    assert model.lm_head.weight.grad is not None
    with torch.no_grad():
        for i, (p, o) in enumerate(zip(prompts, outs)):
            logits = model(input_ids=torch.tensor([p + o])).logits[0]
            ref = torch.log_softmax(logits.float(), -1)[len(p) - 1:len(p) + len(o) - 1].gather(
                1, torch.tensor(o)[:, None]).squeeze(1)
            ref = torch.where(torch.tensor(masks[i]), ref, 0.0)
            assert torch.allclose(got[i, :len(o)].detach(), ref, atol=1e-5)


def test_checkpoint_resume_restores_optimizer_and_version(model_dir, tmp_path):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    cfg = OptimizerConfig(lr=1e-3, warmup_steps=3)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg)
    loss = model(input_ids=torch.tensor([[1, 5, 6, 7]]), labels=torch.tensor([[1, 5, 6, 7]])).loss
    loss.backward()
    opt.step()
    sched.step()
    root = tmp_path / "ckpt"
    assert latest_checkpoint(root) is None
    save_checkpoint(root, model, tok, opt, sched, step=1, policy_version=1, learner_device_seconds=2.0)
    save_checkpoint(root, model, tok, opt, sched, step=2, policy_version=5, learner_device_seconds=3.0)
    save_checkpoint(root, model, tok, opt, sched, step=3, policy_version=7, learner_device_seconds=4.0, keep=2)
    resume = latest_checkpoint(root)
    assert (resume.step, resume.policy_version, resume.learner_device_seconds) == (3, 7, 4.0)
    assert sorted(p.name for p in root.glob("step-*")) == ["step-00000002", "step-00000003"]
    reloaded = AutoModelForCausalLM.from_pretrained(resume.path)  # an HF-format directory
    for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()):
        assert torch.equal(a, b)
    opt2 = build_optimizer(reloaded, cfg)
    sched2 = build_scheduler(opt2, cfg)
    restore_trainer_state(resume.path, opt2, sched2)
    assert sched2.last_epoch == sched.last_epoch
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
