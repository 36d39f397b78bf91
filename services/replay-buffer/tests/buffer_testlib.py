"""Helpers shared by the replay-buffer tests (a uniquely named module: test dirs share sys.path)."""

from __future__ import annotations

import uuid

from scalerl.v1 import common_pb2

CLAIM_IDLE_MS = 200
"""The BufferStore claim timeout in tests (redelivery after a consumer dies)."""


def make_group(job_id, prompt, lease_id="", rewards=(1.0, 0.0), version=0, failed=(), group_id=None,
               tokens=4, device_seconds=0.5):
    """A ScoredGroup for `prompt` (a common_pb2.Prompt or a prompt id) with one completion per reward."""
    if isinstance(prompt, str):
        prompt = common_pb2.Prompt(job_id=job_id, prompt_id=prompt)
    completions = []
    for i, reward in enumerate(rewards):
        c = common_pb2.Completion(token_ids=list(range(tokens)), logprobs=[-0.5] * tokens,
                                  versions=[common_pb2.VersionSpan(version=version, start=0, end=tokens)],
                                  loss_mask=[True] * tokens, finish_reason=common_pb2.FINISH_REASON_STOP)
        status = common_pb2.GRADE_STATUS_FAILED if i in failed else common_pb2.GRADE_STATUS_GRADED
        completions.append(common_pb2.ScoredCompletion(completion=c, reward=reward, grade_status=status))
    return common_pb2.ScoredGroup(job_id=job_id, group_id=group_id or uuid.uuid4().hex, prompt=prompt,
                                  completions=completions, generator_id="gen-test", device_seconds=device_seconds,
                                  lease_id=lease_id)


def assert_invariant(store, job_id):
    s = store.snapshot(job_id)
    assert s.written == s.trained + s.dropped_stale + s.dropped_zero_variance + s.dropped_failed_to_grade + s.pending, s
    return s
