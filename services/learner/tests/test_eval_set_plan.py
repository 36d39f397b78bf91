"""What a queued version is evaluated on: the iid validation split, then each downstream eval set of the recipe."""

from __future__ import annotations

from scalerl.recipe import ValidationConfig
from scalerl_learner.validations import Evaluation, evaluations


def test_iid_split_first_then_every_eval_set_in_order():
    v = ValidationConfig(num_prompts=100, samples_per_prompt=8, eval_sets=[
        {"task": "arithmetic", "name": "arith-hard", "num_prompts": 50},
        {"task": "reasoning_gym/basic_arithmetic", "samples_per_prompt": 2}])
    assert evaluations(v) == [Evaluation("", 100, 8), Evaluation("arith-hard", 50, 4),
                              Evaluation("reasoning_gym/basic_arithmetic", 200, 2)]


def test_without_eval_sets_only_the_iid_split():
    assert evaluations(ValidationConfig()) == [Evaluation("", 1000, 16)]
