"""The built-in prompt sets: deterministic, train/validation disjoint, the difficulty mix respected."""

from __future__ import annotations

import collections

import pytest

from scalerl.recipe import TaskConfig
from scalerl.tasks import TaskPrompt, arithmetic_prompt, build_prompts, is_validation_pair


def _pair(p: TaskPrompt) -> tuple[int, int]:
    a, b = p.text.rstrip("=").split("+")
    return int(a), int(b)


def test_deterministic_prompts():
    cfg = TaskConfig(num_train_prompts=300, num_validation_prompts=100, seed=3)
    assert build_prompts(cfg, "train") == build_prompts(cfg, "train")
    assert build_prompts(cfg, "validation") == build_prompts(cfg, "validation")
    other = build_prompts(TaskConfig(num_train_prompts=300, num_validation_prompts=100, seed=4), "train")
    assert [p.text for p in other] != [p.text for p in build_prompts(cfg, "train")]


def test_prompt_fields_and_answers():
    prompts = build_prompts(TaskConfig(num_train_prompts=200), "train")
    assert len(prompts) == 200
    assert len({p.prompt_id for p in prompts}) == 200
    for p in prompts:
        a, b = _pair(p)
        assert p.text == f"{a}+{b}="
        assert p.answer == str(a + b)
        assert p.task == "exact_numeric"
        assert len(str(a)) == p.metadata["digits"]
        assert len(str(b)) <= p.metadata["digits"]
    assert arithmetic_prompt(47, 85) == ("47+85=", "132")
    assert prompts[0].metadata_json.startswith("{")


def test_train_validation_disjoint():
    cfg = TaskConfig()
    train = {_pair(p) for p in build_prompts(cfg, "train")}
    val = {_pair(p) for p in build_prompts(cfg, "validation")}
    assert train and val and not train & val
    assert all(is_validation_pair(*pv) for pv in val)
    assert not any(is_validation_pair(*pt) for pt in train)
    # Disjoint across seeds too: membership is by pair, not by seed.
    other_train = {_pair(p) for p in build_prompts(TaskConfig(seed=7), "train")}
    assert not other_train & val


@pytest.mark.parametrize("difficulty", [TaskConfig().difficulty, {"1": 0.5, "3": 0.5}, {"2": 0.2, "4": 0.8}])
def test_difficulty_mix_respected(difficulty):
    n = 2000
    prompts = build_prompts(TaskConfig(num_train_prompts=n, difficulty=difficulty), "train")
    counts = collections.Counter(p.metadata["digits"] for p in prompts)
    total = sum(difficulty.values())
    assert set(counts) == {int(d) for d, w in difficulty.items() if w > 0}
    for d, w in difficulty.items():
        assert abs(counts[int(d)] / n - w / total) < 0.05, (d, counts)


def test_unique_pairs_when_available():
    prompts = build_prompts(TaskConfig(num_train_prompts=500, difficulty={"3": 1.0}), "train")
    assert len({p.text for p in prompts}) == 500


def test_unknown_task_names_the_field():
    with pytest.raises(ValueError, match="task.name"):
        build_prompts(TaskConfig(name="nope"), "train")


def test_bad_difficulty_names_the_field():
    with pytest.raises(ValueError, match="task.difficulty"):
        build_prompts(TaskConfig(difficulty={"x": 1.0}), "train")
