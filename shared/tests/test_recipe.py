import pytest
from pydantic import ValidationError

from scalerl.recipe import INTERRUPTION_PHRASE, AdvantageNorm, Aggregation, LossType, Recipe, parse_recipe


def test_defaults_are_the_papers():
    r = Recipe()
    assert r.loss.type is LossType.cispo and r.loss.aggregation is Aggregation.prompt
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


@pytest.mark.parametrize("data, field", [
    ({"loss": {"eps_max": 0}}, "loss.eps_max"),
    ({"pipeline": {"generations_per_prompt": 1}}, "pipeline.generations_per_prompt"),
    ({"data": {"no_positive_resampling_threshold": 1.5}}, "data.no_positive_resampling_threshold"),
    ({"loss": {"aggregation": "median"}}, "loss.aggregation"),
    ({"unknown_knob": 1}, "unknown_knob"),
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
])
def test_cross_field_checks(data, words):
    with pytest.raises(ValidationError) as err:
        parse_recipe(data)
    assert words in str(err.value)
