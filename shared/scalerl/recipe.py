"""The job recipe: every ScaleRL knob, with the paper's defaults (../shared/SCALERL.md §2-4)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      model_validator)

INTERRUPTION_PHRASE = "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class LossType(str, Enum):
    cispo = "cispo"
    grpo = "grpo"
    dapo = "dapo"
    gspo = "gspo"


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
    """`arithmetic` (built-in, graded exact-numeric) or `reasoning_gym/<dataset>`."""
    num_train_prompts: StrictInt = Field(default=8192, ge=1)
    num_validation_prompts: StrictInt = Field(default=1000, ge=1)
    """Held-out prompts, never trained on."""
    difficulty: dict[str, StrictFloat] = Field(default_factory=lambda: {"2": 0.9, "3": 0.1})
    """Arithmetic: share of prompts by operand digits (a mix the tiny model cannot all master gives A < 1)."""
    seed: StrictInt = 0


class LossConfig(_Strict):
    type: LossType = LossType.cispo
    """cispo (ScaleRL), or grpo / dapo / gspo for ablations."""
    eps_max: StrictFloat = Field(default=4.0, gt=0)
    """CISPO: upper truncation of the token IS ratio (no lower clip)."""
    clip_low: StrictFloat = Field(default=0.2, ge=0, lt=1)
    """GRPO/DAPO: lower clip ε."""
    clip_high: StrictFloat = Field(default=0.28, ge=0)
    """GRPO: ignored (symmetric clip_low); DAPO: ε_high."""
    gspo_clip: StrictFloat = Field(default=5e-3, gt=0)
    """GSPO: clip on the sequence-level ratio."""
    aggregation: Aggregation = Aggregation.prompt
    """prompt-average (ScaleRL), sample-average (GRPO) or token-average (DAPO)."""
    advantage_norm: AdvantageNorm = AdvantageNorm.batch
    """batch-level (ScaleRL), prompt-level (GRPO) or none."""


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
    loss: LossConfig = LossConfig()
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
        if self.loss.type is LossType.dapo and self.loss.clip_high < self.loss.clip_low:
            raise ValueError("loss.clip_high must be >= loss.clip_low for dapo")
        if self.validation.num_prompts > self.task.num_validation_prompts:
            raise ValueError("validation.num_prompts must be <= task.num_validation_prompts")
        return self


def parse_recipe(data: dict | str) -> Recipe:
    """Validate a recipe from a dict or its JSON; raises pydantic.ValidationError naming the field."""
    if isinstance(data, str):
        return Recipe.model_validate_json(data)
    return Recipe.model_validate(data)
