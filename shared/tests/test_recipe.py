from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from scalerl.recipe import (INTERRUPTION_PHRASE, AdvantageNorm, Aggregation, CispoLossConfig, DapoLossConfig,
                            GrpoLossConfig, GspoLossConfig, Recipe, TaskConfig, parse_recipe)

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_the_papers():
    r = Recipe()
    assert isinstance(r.loss, CispoLossConfig) and r.loss.aggregation is Aggregation.prompt
    assert r.loss.eps_max == 4.0
    assert r.loss.advantage_norm is AdvantageNorm.batch
    assert r.model.fp32_lm_head and r.data.zero_variance_filter
    assert r.pipeline.max_staleness == 8
    assert (r.pipeline.prompts_per_batch, r.pipeline.generations_per_prompt) == (48, 16)
    assert (r.optimizer.lr, r.optimizer.adam_eps, r.optimizer.weight_decay, r.optimizer.warmup_steps) == (
        5e-7, 1e-15, 0.01, 100)
    assert r.data.no_positive_resampling_threshold == 0.9
    assert (r.validation.every_steps, r.validation.num_prompts, r.validation.samples_per_prompt) == (100, 1000, 16)
    assert r.generation.interruption_phrase == INTERRUPTION_PHRASE
    assert r.forecast.min_compute == 1500


def test_json_round_trip():
    r = Recipe(loss={"type": "dapo", "clip_high": 0.28})
    assert parse_recipe(r.model_dump_json()) == r


def test_no_positive_resampling_can_be_switched_off():
    r = parse_recipe({"data": {"no_positive_resampling_threshold": None}})
    assert r.data.no_positive_resampling_threshold is None
    assert parse_recipe(r.model_dump_json()) == r


@pytest.mark.parametrize("data, field", [
    ({"loss": {"eps_max": 0}}, "loss.cispo.eps_max"),  # the path names the loss variant
    ({"pipeline": {"generations_per_prompt": 1}}, "pipeline.generations_per_prompt"),
    ({"data": {"no_positive_resampling_threshold": 1.5}}, "data.no_positive_resampling_threshold"),
    ({"data": {"retired_recheck_fraction": 1.5}}, "data.retired_recheck_fraction"),
    ({"loss": {"aggregation": "median"}}, "loss.cispo.aggregation"),
    ({"unknown_knob": 1}, "unknown_knob"),
    ({"optimizer": {"adaptive_lr": {"target_sampler_kl": 0}}}, "optimizer.adaptive_lr.target_sampler_kl"),
    ({"optimizer": {"adaptive_lr": {"target_sampler_kl": 0.01, "factor": 1.0}}}, "optimizer.adaptive_lr.factor"),
    ({"optimizer": {"adaptive_lr": {"target_sampler_kl": 0.01, "min_lr_ratio": 0}}},
     "optimizer.adaptive_lr.min_lr_ratio"),
    ({"optimizer": {"adaptive_lr": {}}}, "optimizer.adaptive_lr.target_sampler_kl"),
])
def test_invalid_values_name_the_field(data, field):
    with pytest.raises(ValidationError) as err:
        parse_recipe(data)
    assert field in str(err.value)


@pytest.mark.parametrize("data, words", [
    ({"generation": {"thinking_budget_low": 10, "thinking_budget_high": 5}}, "thinking_budget_low"),
    ({"budget": {"max_steps": None, "compute_device_hours": None}}, "max_steps"),
    ({"loss": {"type": "dapo", "clip_low": 0.3, "clip_high": 0.2}}, "clip_high"),
    ({"validation": {"num_prompts": 2000}}, "validation.num_prompts"),
    ({"data": {"no_positive_resampling_threshold": None, "retired_recheck_fraction": 0.1}},
     "data.retired_recheck_fraction"),
])
def test_cross_field_checks(data, words):
    with pytest.raises(ValidationError) as err:
        parse_recipe(data)
    assert words in str(err.value)


def test_a_loss_without_type_is_cispo():
    assert Recipe(loss={}).loss == CispoLossConfig()
    assert parse_recipe({"loss": {"eps_max": 2.0, "aggregation": "token"}}).loss == CispoLossConfig(
        eps_max=2.0, aggregation="token")


@pytest.mark.parametrize("loss, cls", [
    ({"type": "cispo", "eps_max": 3.0}, CispoLossConfig),
    ({"type": "grpo", "clip_low": 0.1, "aggregation": "sample", "advantage_norm": "prompt"}, GrpoLossConfig),
    ({"type": "dapo", "clip_low": 0.2, "clip_high": 0.28, "aggregation": "token"}, DapoLossConfig),
    ({"type": "gspo", "gspo_clip": 3e-3}, GspoLossConfig),
])
def test_each_loss_parses_to_its_own_config(loss, cls):
    r = parse_recipe({"loss": loss})
    assert type(r.loss) is cls and r.loss.type == loss["type"]
    assert r.loss.model_dump(mode="json", include=set(loss)) == loss
    assert parse_recipe(r.model_dump_json()) == r


@pytest.mark.parametrize("loss, field", [
    ({"type": "grpo", "eps_max": 4}, "loss.grpo.eps_max"),  # a field of another loss is refused, not ignored
    ({"type": "grpo", "clip_high": 0.28}, "loss.grpo.clip_high"),
    ({"type": "cispo", "clip_low": 0.2}, "loss.cispo.clip_low"),
    ({"type": "gspo", "eps_max": 4}, "loss.gspo.eps_max"),
    ({"type": "dapo", "gspo_clip": 0.1}, "loss.dapo.gspo_clip"),
])
def test_a_field_the_loss_does_not_have_is_refused_naming_it(loss, field):
    with pytest.raises(ValidationError) as err:
        parse_recipe({"loss": loss})
    assert field in str(err.value) and "Extra inputs are not permitted" in str(err.value)


def test_unknown_loss_type_is_refused_naming_type():
    with pytest.raises(ValidationError) as err:
        parse_recipe({"loss": {"type": "ppo2"}})
    (error,) = err.value.errors()
    assert error["loc"] == ("loss",) and "type must be one of 'cispo', 'grpo', 'dapo', 'gspo'" in error["msg"]


@pytest.mark.parametrize("task, verifier", [
    ({"name": "arithmetic"}, None),
    ({"name": "arithmetic", "verifier": "math"}, "math"),
    ({"name": "reasoning_gym/basic_arithmetic"}, None),
    ({"name": "reasoning_gym/basic_arithmetic", "verifier": "reasoning_gym"}, "reasoning_gym"),
])
def test_registered_tasks_and_verifiers_validate(task, verifier):
    assert parse_recipe({"task": task}).task.verifier == verifier


@pytest.mark.parametrize("task, loc, words", [
    ({"name": "astrology"}, ("task", "name"), "unknown task 'astrology'"),
    ({"name": "reasoning_gym"}, ("task", "name"), "reasoning_gym/<dataset>"),  # the family needs a dataset
    ({"name": "arithmetic", "verifier": "tarot"}, ("task", "verifier"), "unknown verifier 'tarot'"),
    ({"name": "arithmetic", "verifier": "reasoning_gym"}, ("task", "verifier"), "cannot be graded by"),
    ({"name": "reasoning_gym/basic_arithmetic", "verifier": "exact_numeric"}, ("task", "verifier"),
     "cannot be graded by"),
])
def test_unknown_task_or_verifier_is_refused_naming_the_field(task, loc, words):
    with pytest.raises(ValidationError) as err:
        parse_recipe({"task": task})
    (error,) = err.value.errors()
    assert error["loc"] == loc and words in error["msg"]


def test_task_config_alone_is_checked_too():
    with pytest.raises(ValidationError, match="unknown task"):
        TaskConfig(name="nope")


def test_demo_recipe_validates():
    doc = yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())
    r = parse_recipe(doc["recipe"])
    assert isinstance(r.loss, CispoLossConfig) and r.task.name == "arithmetic" and r.task.verifier is None


def test_schema_lets_only_cispo_leave_out_type():
    """A loss in the OpenAPI schema matches exactly one variant (oneOf), as it does in validation."""
    defs = Recipe.model_json_schema()["$defs"]
    assert "required" not in defs["CispoLossConfig"]
    assert all(defs[name]["required"] == ["type"] for name in ("GrpoLossConfig", "DapoLossConfig", "GspoLossConfig"))


def test_demo_interruption_budget_lies_beyond_every_answer():
    """Forced interruption must cut only a completion that runs on, never a complete answer: a budget drawn below
    the longest answer (its digits + EOS, in the tiny model's tokens) cut correct answers in training and
    validation and slowed the demo's climb."""
    from scalerl.models import build_tokenizer

    r = parse_recipe(yaml.safe_load((REPO / "recipes" / "demo.yaml").read_text())["recipe"])
    assert r.model.path == "builtin:tiny-arithmetic" and r.generation.forced_interruption
    tok = build_tokenizer()
    longest = max(int(d) for d in r.task.difficulty)
    answer = str(2 * (10**longest - 1))  # the largest sum of two operands of that many digits
    answer_tokens = len(tok(answer + tok.eos_token, add_special_tokens=False)["input_ids"])
    assert answer_tokens == len(answer) + 1  # one token per character, then </s>
    assert r.generation.thinking_budget_low > answer_tokens
