"""bf16 body with the FP32 LM head: the head's matmul and log-softmax in float32 make the learner's log-probs
close to a float64 head on the same bf16 hidden states; without the upcast they are bf16-rounded logits."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from scalerl.models import build_tiny_model
from scalerl.recipe import ModelConfig, Recipe
from scalerl.v1 import common_pb2
from scalerl_learner.batch import LogprobOptions, build_batch, output_logprobs
from scalerl_learner.trainer import resolve_device


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", sft_steps=30)


def groups(n: int, seed: int = 0) -> list[common_pb2.ScoredGroup]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = [1] + torch.randint(4, 90, (6,), generator=g).tolist()
        tokens = torch.randint(4, 90, (12,), generator=g).tolist()
        c = common_pb2.Completion(token_ids=tokens, logprobs=[0.0] * 12, loss_mask=[True] * 12,
                                  versions=[common_pb2.VersionSpan(version=0, start=0, end=12)])
        out.append(common_pb2.ScoredGroup(job_id="j", group_id=str(i), prompt_token_ids=prompt, completions=[
            common_pb2.ScoredCompletion(completion=c, reward=1.0)]))
    return out


def test_fp32_head_on_a_bf16_body_is_at_least_10x_closer_to_a_float64_head(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    assert model.lm_head.weight.dtype == torch.bfloat16
    batch = build_batch(groups(8), pad_id=0)
    with torch.no_grad():
        fp32 = output_logprobs(model, batch, LogprobOptions(fp32_lm_head=True))
        plain = output_logprobs(model, batch, LogprobOptions(fp32_lm_head=False))
        # Reference: the same bf16 hidden states, head and log-softmax in float64.
        hidden = model.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        logp = torch.log_softmax(hidden.double() @ model.lm_head.weight.double().T, dim=-1)
        width = batch.loss_mask.shape[1]
        pos = batch.completion_start[:, None] + torch.arange(width)[None, :]
        ref = logp.gather(1, (pos - 1)[:, :, None].expand(-1, -1, logp.shape[-1])).gather(
            2, batch.input_ids.gather(1, pos)[:, :, None]).squeeze(-1)
    gap_fp32 = (fp32.double() - ref).abs().max().item()
    gap_plain = (plain.double() - ref).abs().max().item()
    assert gap_plain > 1e-3  # bf16 logits really are rounded: the test can tell the two apart
    assert gap_fp32 * 10 <= gap_plain, (gap_fp32, gap_plain)
    assert gap_fp32 < 1e-4


def test_auto_dtype_is_bf16_on_cuda_and_fp32_on_cpu():
    m = ModelConfig(dtype="auto")
    assert (m.resolved_dtype(cuda=True), m.resolved_dtype(cuda=False)) == ("bfloat16", "float32")
    assert ModelConfig(dtype="float16").resolved_dtype(cuda=True) == "float16"
    assert Recipe().learner.device == "auto"


def test_device_auto_follows_cuda_and_cuda_without_a_gpu_is_an_error():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="learner.device"):
            resolve_device("cuda")
