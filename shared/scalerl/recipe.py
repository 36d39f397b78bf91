"""The job recipe: every ScaleRL knob, with the paper's defaults (docs/scalerl.md §2-4)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      Tag, ValidationInfo, field_validator, model_validator)

from scalerl.tasks import find_task, task_names, verifier_names

INTERRUPTION_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class Aggregation(str, Enum):
    prompt = "prompt"
    sample = "sample"
    token = "token"


class AdvantageNorm(str, Enum):
    batch = "batch"
    prompt = "prompt"
    none = "none"


class PipelineMode(str, Enum):
    pipeline_rl = "pipeline_rl"
    ppo_off_policy = "ppo_off_policy"


class KVCacheOnUpdate(str, Enum):
    keep = "keep"
    recompute = "recompute"


class ModelConfig(_Strict):
    path: StrictStr = "builtin:tiny-arithmetic"
    """A local HF-format checkpoint directory, or `builtin:tiny-arithmetic` (built offline by scalerl)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype of the model body on learner and generator."""
    fp32_lm_head: StrictBool = True
    """Compute the LM head logits and log-softmax in float32 on generator and learner."""
    max_model_len: StrictInt = Field(default=128, ge=16)
    """Prompt + completion tokens per sequence."""


class TaskConfig(_Strict):
    name: StrictStr = "arithmetic"
    """A registered task (`scalerl.tasks`): `arithmetic` (built-in) or `reasoning_gym/<dataset>`."""
    verifier: StrictStr | None = None
    """The verifier that grades the completions, one the task accepts; default: the task's own
    (`arithmetic`: exact_numeric, `reasoning_gym/*`: reasoning_gym's scorer; both also accept `math`)."""
    num_train_prompts: StrictInt = Field(default=8192, ge=1)
    num_validation_prompts: StrictInt = Field(default=1000, ge=1)
    """Held-out prompts, never trained on."""
    difficulty: dict[str, StrictFloat] = Field(default_factory=lambda: {"2": 0.9, "3": 0.1})
    """Arithmetic: share of prompts by operand digits (a mix the tiny model cannot all master gives A < 1)."""
    seed: StrictInt = 0

    # Checked against the registry by name only: the api validates recipes without the tasks' packages.
    @field_validator("name")
    @classmethod
    def _registered_task(cls, name: str) -> str:
        if find_task(name) is None:
            raise ValueError(f"unknown task {name!r}; registered: {', '.join(task_names())}")
        return name

    @field_validator("verifier")
    @classmethod
    def _registered_verifier(cls, verifier: str | None, info: ValidationInfo) -> str | None:
        if verifier is None:
            return None
        if verifier not in verifier_names():
            raise ValueError(f"unknown verifier {verifier!r}; registered: {', '.join(verifier_names())}")
        task = find_task(info.data.get("name", ""))  # absent when the name itself was refused
        if task is not None and verifier not in task.verifiers:
            raise ValueError(f"task {info.data['name']!r} cannot be graded by {verifier!r}; "
                             f"it accepts {', '.join(task.verifiers)}")
        return verifier


class _LossBase(_Strict):
    type: str  # declared here so that `type` comes first in dumps and schemas
    """Which loss: cispo (ScaleRL), or grpo / dapo / gspo for ablations. Left out: cispo."""
    aggregation: Aggregation = Aggregation.prompt
    """prompt-average (ScaleRL), sample-average (GRPO) or token-average (DAPO)."""
    advantage_norm: AdvantageNorm = AdvantageNorm.batch
    """batch-level (ScaleRL), prompt-level (GRPO) or none."""


class CispoLossConfig(_LossBase):
    """CISPO (ScaleRL): truncated importance-sampling weights, no lower clip."""

    type: Literal["cispo"] = "cispo"
    """Selects CISPO; the loss when `type` is left out."""
    eps_max: StrictFloat = Field(default=4.0, gt=0)
    """Upper truncation of the token IS ratio."""


# In the JSON schema only CISPO may leave out `type`, so that a loss matches exactly one variant (oneOf).
_TYPE_REQUIRED = ConfigDict(json_schema_extra={"required": ["type"]})


class GrpoLossConfig(_LossBase):
    """GRPO: the PPO clip, symmetric."""

    model_config = _TYPE_REQUIRED
    type: Literal["grpo"] = "grpo"
    """Selects GRPO."""
    clip_low: StrictFloat = Field(default=0.2, ge=0, lt=1)
    """ε: the ratio is clipped to [1 − ε, 1 + ε]."""


class DapoLossConfig(_LossBase):
    """DAPO: the PPO clip with a higher upper bound ("clip-higher")."""

    model_config = _TYPE_REQUIRED
    type: Literal["dapo"] = "dapo"
    """Selects DAPO."""
    clip_low: StrictFloat = Field(default=0.2, ge=0, lt=1)
    """ε_low: lower clip 1 − ε_low."""
    clip_high: StrictFloat = Field(default=0.28, ge=0)
    """ε_high: upper clip 1 + ε_high; at least clip_low."""

    @model_validator(mode="after")
    def _clip_high_not_below_clip_low(self) -> "DapoLossConfig":
        if self.clip_high < self.clip_low:
            raise ValueError("clip_high must be >= clip_low")
        return self


class GspoLossConfig(_LossBase):
    """GSPO: the PPO clip on the sequence-level ratio."""

    model_config = _TYPE_REQUIRED
    type: Literal["gspo"] = "gspo"
    """Selects GSPO."""
    gspo_clip: StrictFloat = Field(default=5e-3, gt=0)
    """c: the sequence ratio is clipped to [1 − c, 1 + c]."""


def _loss_type(value: Any) -> Any:
    # A loss without `type` is CISPO, so recipes written before the union keep parsing.
    if isinstance(value, dict):
        return value.get("type", "cispo")
    return getattr(value, "type", None)


LossConfig = Annotated[
    Annotated[CispoLossConfig, Tag("cispo")] | Annotated[GrpoLossConfig, Tag("grpo")]
    | Annotated[DapoLossConfig, Tag("dapo")] | Annotated[GspoLossConfig, Tag("gspo")],
    Discriminator(_loss_type, custom_error_type="loss_type",
                  custom_error_message="type must be one of 'cispo', 'grpo', 'dapo', 'gspo'"),
]
"""The policy loss, chosen by `type`: cispo (ScaleRL, the default), or grpo / dapo / gspo for ablations."""


class OptimizerConfig(_Strict):
    lr: StrictFloat = Field(default=5e-7, gt=0)
    warmup_steps: StrictInt = Field(default=100, ge=0)
    """Linear warmup, then constant."""
    adam_eps: StrictFloat = Field(default=1e-15, gt=0)
    weight_decay: StrictFloat = Field(default=0.01, ge=0)
    betas: tuple[StrictFloat, StrictFloat] = (0.9, 0.999)
    grad_clip: StrictFloat = Field(default=1.0, gt=0)


class PipelineConfig(_Strict):
    mode: PipelineMode = PipelineMode.pipeline_rl
    """pipeline_rl: continuous generation with in-flight updates; ppo_off_policy: k frozen batches then k steps."""
    max_staleness: StrictInt = Field(default=8, ge=0)
    """k: groups whose oldest token is more than k versions behind the learner are not trained on."""
    kv_cache_on_update: KVCacheOnUpdate = KVCacheOnUpdate.keep
    """keep: continue over old-weight KV (PipelineRL); recompute: clear the cache and re-prefill."""
    prompts_per_batch: StrictInt = Field(default=48, ge=1)
    generations_per_prompt: StrictInt = Field(default=16, ge=2)
    """G completions per prompt (a group)."""


class GenerationConfig(_Strict):
    temperature: StrictFloat = Field(default=1.0, gt=0)
    top_p: StrictFloat = Field(default=1.0, gt=0, le=1)
    thinking_budget_low: StrictInt = Field(default=10_240, ge=1)
    thinking_budget_high: StrictInt = Field(default=12_288, ge=1)
    """The thinking budget is drawn uniformly from [low, high] per completion."""
    solution_budget: StrictInt = Field(default=2_048, ge=1)
    interruption_phrase: StrictStr = INTERRUPTION_PHRASE
    """Appended when thinking passes the budget; masked out of the loss."""
    forced_interruption: StrictBool = True


class DataConfig(_Strict):
    zero_variance_filter: StrictBool = True
    """Drop groups whose rewards are all equal from the loss (counted, not resampled)."""
    no_positive_resampling_threshold: StrictFloat = Field(default=0.9, gt=0, le=1)
    """Retire a prompt permanently once its pass rate reaches this (1.0 = only perfect prompts)."""
    lease_seconds: StrictFloat = Field(default=120.0, gt=0)


class ValidationConfig(_Strict):
    every_steps: StrictInt = Field(default=100, ge=1)
    num_prompts: StrictInt = Field(default=1000, ge=1)
    samples_per_prompt: StrictInt = Field(default=16, ge=1)
    """mean@k: k samples per validation prompt."""
    at_step_zero: StrictBool = True
    """Evaluate the base model first (R0 of the fit)."""


class BudgetConfig(_Strict):
    max_steps: StrictInt | None = Field(default=1000, ge=1)
    compute_device_hours: StrictFloat | None = Field(default=None, gt=0)
    """The job ends when either budget is reached."""
    target_pass_rate: StrictFloat | None = Field(default=None, gt=0, le=1)
    """Optional: the forecaster reports the compute needed to reach it."""
    checkpoint_every_steps: StrictInt = Field(default=50, ge=1)


class ForecastConfig(_Strict):
    min_compute: StrictFloat = Field(default=1500.0, ge=0)
    """Points below this compute (device-hours) stay out of the fit, except the step-0 point that gives R0
    (the paper: 1.5k GPU-hours, about one epoch; the tiny demo model uses a proportionally small value)."""
    level: StrictFloat = Field(default=0.8, gt=0, lt=1)
    """Nominal coverage of the reported intervals."""


class Recipe(_Strict):
    name: StrictStr = "scalerl"
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    loss: LossConfig = CispoLossConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    pipeline: PipelineConfig = PipelineConfig()
    generation: GenerationConfig = GenerationConfig()
    data: DataConfig = DataConfig()
    validation: ValidationConfig = ValidationConfig()
    budget: BudgetConfig = BudgetConfig()
    forecast: ForecastConfig = ForecastConfig()
    seed: Annotated[StrictInt, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _cross_field_checks(self) -> "Recipe":
        g = self.generation
        if g.thinking_budget_low > g.thinking_budget_high:
            raise ValueError("generation.thinking_budget_low must be <= generation.thinking_budget_high")
        if self.budget.max_steps is None and self.budget.compute_device_hours is None:
            raise ValueError("budget: set max_steps or compute_device_hours so the job can end")
        if self.validation.num_prompts > self.task.num_validation_prompts:
            raise ValueError("validation.num_prompts must be <= task.num_validation_prompts")
        return self


def parse_recipe(data: dict | str) -> Recipe:
    """Validate a recipe from a dict or its JSON; raises pydantic.ValidationError naming the field."""
    if isinstance(data, str):
        return Recipe.model_validate_json(data)
    return Recipe.model_validate(data)
