"""The job recipe: every ScaleRL knob, with the paper's defaults (docs/scalerl.md §2-4)."""

from __future__ import annotations

import os
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
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """Dtype of the model body on learner and generator; `auto`: bfloat16 on CUDA, float32 on CPU."""
    fp32_lm_head: StrictBool = True
    """Compute the LM head logits and log-softmax in float32 on generator and learner."""
    max_model_len: StrictInt = Field(default=128, ge=16)
    """Prompt + completion tokens per sequence."""

    def resolved_dtype(self, cuda: bool) -> str:
        """The torch dtype name the model runs in on this device (`auto` resolved)."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if cuda else "float32"


class LearnerConfig(_Strict):
    """How the learner runs a step on its hardware; none of these change what is computed, only where and in
    how much memory (the loss and gradients are those of the whole batch)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the learner trains: `auto` is CUDA when present, else CPU."""
    micro_batch_tokens: StrictInt = Field(default=32_768, ge=1)
    """Token budget of one micro-batch (rows x padded length); gradients accumulate over micro-batches. Samples
    are never split: a longer sample is a micro-batch of its own."""
    logprob_chunk_tokens: StrictInt = Field(default=1_024, ge=1)
    """Output tokens whose float32 logits [chunk, vocab] exist at once; recomputed chunk by chunk in backward."""
    activation_checkpointing: StrictBool = False
    """Recompute the transformer layers' activations in backward (less memory, ~1/3 more compute)."""


class FileDatasetConfig(_Strict):
    """The `file` task's data: a JSONL or Parquet file on a volume the api, replay-buffer and evaluator read.

    The file is checked where a recipe is submitted (validated from Python data: the api's request body,
    `parse_recipe(dict)`); services that re-read a stored recipe from its JSON (learner, forecaster) do not
    touch the file, and the replay-buffer and evaluator read it when they build prompts."""

    path: StrictStr
    """Path of the file; checked at submit (exists, readable, not empty)."""
    format: Literal["auto", "jsonl", "parquet"] = "auto"
    """auto: from the suffix (.jsonl / .json / .ndjson, .parquet / .pq)."""
    prompt_field: StrictStr = "prompt"
    """Field (column) holding the prompt text."""
    answer_field: StrictStr = "answer"
    """Field holding the reference answer the verifier compares with."""
    verifier_field: StrictStr | None = None
    """Optional field naming each row's verifier (a registered one); rows without it use task.verifier."""
    id_field: StrictStr | None = None
    """Optional field with a stable row id; default: a hash of the prompt text. The validation split is held
    out by id."""
    validation_fraction: StrictFloat = Field(default=0.1, gt=0, lt=1)
    """Share of ids held out for validation (by hash of the id, so a row never changes side)."""

    @field_validator("path")
    @classmethod
    def _readable(cls, path: str, info: ValidationInfo) -> str:
        from scalerl.tasks.files import check_readable

        if info.mode == "python":
            check_readable(path)
        return path

    @field_validator("prompt_field", "answer_field", "verifier_field", "id_field")
    @classmethod
    def _present(cls, name: str | None, info: ValidationInfo) -> str | None:
        from scalerl.tasks.files import first_record_fields

        path = info.data.get("path")
        if name is None or path is None or info.mode != "python":  # no path: the path itself was refused
            return name
        fields = first_record_fields(path, info.data.get("format", "auto"))
        if name not in fields:
            raise ValueError(f"{path!r} has no field {name!r} (its first record has: {', '.join(sorted(fields))})")
        return name


def check_file_dataset(task: str, dataset: "FileDatasetConfig | None", *, field: str, reader: str) -> None:
    """The `file` task reads a dataset and no other task does; `reader` names the one that may."""
    if task == "file" and dataset is None:
        raise ValueError(f"{field}: {reader} needs a dataset (path and field names)")
    if task != "file" and dataset is not None:
        raise ValueError(f"{field}: only {reader} reads a dataset, not {task!r}")


def check_verifier(verifier: str | None, task_name: str | None) -> str | None:
    """A recipe's verifier must be registered and accepted by its task."""
    if verifier is None:
        return None
    if verifier not in verifier_names():
        raise ValueError(f"unknown verifier {verifier!r}; registered: {', '.join(verifier_names())}")
    task = find_task(task_name or "")
    if task is not None and verifier not in task.verifiers:
        raise ValueError(f"task {task_name!r} cannot be graded by {verifier!r}; it accepts {', '.join(task.verifiers)}")
    return verifier


class TaskConfig(_Strict):
    name: StrictStr = "arithmetic"
    """A registered task (`scalerl.tasks`): `arithmetic` (built-in), `reasoning_gym/<dataset>` or `file`
    (the user's JSONL / Parquet, see `dataset`)."""
    dataset: FileDatasetConfig | None = None
    """The `file` task's file and field mapping (required for it, refused for the others)."""
    verifier: StrictStr | None = None
    """The verifier that grades the completions, one the task accepts; default: the task's own
    (`arithmetic`: exact_numeric, `reasoning_gym/*`: reasoning_gym's scorer; both also accept `math`)."""
    num_train_prompts: StrictInt = Field(default=8192, ge=1)
    num_validation_prompts: StrictInt = Field(default=1000, ge=1)
    """Held-out prompts, never trained on."""
    difficulty: dict[str, StrictFloat] = Field(default_factory=lambda: {"2": 0.9, "3": 0.1})
    """Arithmetic: share of prompts by operand digits (a mix the tiny model cannot all master gives A < 1)."""
    seed: StrictInt = 0

    @model_validator(mode="after")
    def _dataset_only_for_file(self) -> "TaskConfig":
        check_file_dataset(self.name, self.dataset, field="task.dataset", reader="the file task")
        return self

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
        return check_verifier(verifier, info.data.get("name"))  # no name: the name itself was refused


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


class AdaptiveLRConfig(_Strict):
    """Damps the learning rate while the policy moves too far per step (the adaptive schedule of RSL-RL's
    PPO, bounded above by `optimizer.lr`). The signal is the step's sampler KL, KL(generator's policy ‖
    learner's policy) over its loss tokens: the generator and learner agree on the same weights, so it
    measures how far the policy moved in the batch's few versions of lag. Above 2 × target the lr is
    divided by `factor`, below target / 2 multiplied by it, between the two kept."""

    target_sampler_kl: StrictFloat = Field(gt=0)
    """The sampler KL per step aimed at; the dead band [target / 2, 2 × target] leaves the lr alone."""
    factor: StrictFloat = Field(default=1.5, gt=1)
    """How much one step outside the dead band moves the lr."""
    min_lr_ratio: StrictFloat = Field(default=0.1, gt=0, le=1)
    """The lr never falls below min_lr_ratio × lr (nor rises above lr)."""


class OptimizerConfig(_Strict):
    lr: StrictFloat = Field(default=5e-7, gt=0)
    warmup_steps: StrictInt = Field(default=100, ge=0)
    """Linear warmup, then constant."""
    adaptive_lr: AdaptiveLRConfig | None = None
    """None (the paper's recipe): the warmed-up lr is constant. Set: it is damped while the sampler KL runs
    high, and recovers as it falls."""
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
    publish_in_background: StrictBool = True
    """The learner sends each new version while it trains the next step, held only for a copy of the weights
    (into the transport's host buffer) and for the previous version's send to end. Generators get a version as
    early as with false, but the learner reads its next batch before they have it, so that batch may hold one
    more version of lag (within max_staleness as ever). false: every step waits until its version has reached
    the transport (PipelineRL's order), as it always does on the torch_distributed transport."""
    prompts_per_batch: StrictInt = Field(default=48, ge=1)
    generations_per_prompt: StrictInt = Field(default=16, ge=2)
    """G completions per prompt (a group)."""


class PromptConfig(_Strict):
    chat_template: Literal["auto", "none"] = "auto"
    """auto: render each prompt as a user turn with the model's chat template when its tokenizer has one (the
    tiny model has none: plain text); none: the prompt text as is."""
    system_prompt: StrictStr | None = None
    """System turn before each prompt; None: the template's own default (SmolLM2's names itself)."""


class GenerationConfig(_Strict):
    temperature: StrictFloat = Field(default=1.0, gt=0)
    top_p: StrictFloat = Field(default=1.0, gt=0, le=1)
    thinking_budget_low: StrictInt = Field(default=10_240, ge=1)
    thinking_budget_high: StrictInt = Field(default=12_288, ge=1)
    """The thinking budget is drawn uniformly from [low, high] per completion."""
    solution_budget: StrictInt = Field(default=2_048, ge=1)
    """Tokens after the interruption phrase; without interruption the completion may use
    thinking_budget_high + solution_budget tokens."""
    interruption_phrase: StrictStr = INTERRUPTION_PHRASE
    """Appended when thinking passes the budget; masked out of the loss."""
    forced_interruption: StrictBool = False
    """Interrupt thinking at the budget (ScaleRL). When on, the budgets and the phrase must fit
    model.max_model_len (checked); off by default because the paper's budgets (10,240-12,288 + 2,048) need
    a max_model_len of ~14.5k that the default tiny model does not have."""


class DataConfig(_Strict):
    zero_variance_filter: StrictBool = True
    """Drop groups whose rewards are all equal from the loss (counted, not resampled)."""
    no_positive_resampling_threshold: StrictFloat | None = Field(default=0.9, gt=0, le=1)
    """Retire a prompt once the pass rate of its latest epoch reaches this (1.0 = only perfect prompts); a retired
    prompt is not leased again unless retired_recheck_fraction puts it back. None: never retire (the paper's
    ablation without No-Positive-Resampling). On a finite pool the later epochs then hold only the prompts the
    policy failed, and a policy that forgets the retired ones is not corrected (docs/benchmarks/demo_recipe.md,
    session 15)."""
    retired_recheck_fraction: StrictFloat = Field(default=0.0, ge=0, le=1)
    """Share of the retired prompts put back into each new epoch to check that the policy still solves them; one
    whose group there scores below no_positive_resampling_threshold returns to the pool. Rechecks of prompts still
    solved come back as zero-variance groups: generation spent, no gradient. 0: no rechecks (the paper). A pool
    whose every prompt is retired still ends the job."""
    lease_seconds: StrictFloat = Field(default=120.0, gt=0)


class ValidationConfig(_Strict):
    every_steps: StrictInt = Field(default=100, ge=1)
    num_prompts: StrictInt = Field(default=1000, ge=1)
    samples_per_prompt: StrictInt = Field(default=16, ge=1)
    """mean@k: k samples per validation prompt."""
    at_step_zero: StrictBool = True
    """Evaluate the base model first (R0 of the fit)."""
    eval_sets: list["EvalSetConfig"] = Field(default_factory=list, max_length=16)
    """Downstream evaluation sets beside the iid validation split: each is evaluated on the same pinned versions
    at the same cadence, gets its own curve and fit, and its Spearman correlation with iid validation over
    versions (REST /v1/jobs/{id}/curve?set=NAME, /v1/jobs/{id}/correlations)."""

    @field_validator("eval_sets")
    @classmethod
    def _distinct_set_names(cls, sets: list["EvalSetConfig"]) -> list["EvalSetConfig"]:
        names = [s.set_name for s in sets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"eval set names must be distinct: {', '.join(dup)} more than once")
        return sets


class EvalSetConfig(_Strict):
    """One downstream evaluation set (part of ValidationConfig)."""

    task: StrictStr
    """A registered task (`scalerl.tasks`), e.g. `arithmetic` or `reasoning_gym/<dataset>`, whose validation
    prompts are the set; or `file`: every record of `dataset` (a benchmark the job does not train on)."""
    name: StrictStr | None = Field(default=None, min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-/]+$")
    """The set's name in curves and metrics (default: the task's name; required for a `file` set); `iid` is the
    validation split's."""
    dataset: FileDatasetConfig | None = None
    """A `file` set's file and field mapping (required for it, refused for the other tasks). Every record is
    evaluated, up to `num_prompts`; `validation_fraction` does not apply."""
    verifier: StrictStr | None = None
    """The verifier that grades the set (default: the task's own), as `task.verifier`."""
    num_prompts: StrictInt = Field(default=200, ge=1)
    samples_per_prompt: StrictInt = Field(default=4, ge=1)
    """mean@k: k samples per prompt."""

    @property
    def set_name(self) -> str:
        return self.name or self.task

    @field_validator("task")
    @classmethod
    def _registered(cls, name: str) -> str:
        return TaskConfig._registered_task(name)

    @field_validator("verifier")
    @classmethod
    def _registered_verifier(cls, verifier: str | None, info: ValidationInfo) -> str | None:
        return check_verifier(verifier, info.data.get("task"))  # no task: the task itself was refused

    @model_validator(mode="after")
    def _file_sets(self) -> "EvalSetConfig":
        check_file_dataset(self.task, self.dataset, field="dataset", reader="a file eval set")
        if self.task == "file" and self.name is None:
            raise ValueError("name: a file eval set needs a name for its curve (e.g. the benchmark's)")
        return self

    def task_config(self, seed: int) -> "TaskConfig":
        """The set as task settings for `scalerl.tasks.build_prompts` (split `eval_set_split(task)`)."""
        return TaskConfig(name=self.task, dataset=self.dataset, verifier=self.verifier,
                          num_validation_prompts=self.num_prompts, seed=seed)


def eval_set_split(task: str) -> str:
    """The split a downstream set is drawn from: a file set is the whole file, a registered task's set its
    held-out validation prompts."""
    return "all" if task == "file" else "validation"

    @field_validator("name")
    @classmethod
    def _not_iid(cls, name: str | None) -> str | None:
        if name == "iid":
            raise ValueError("`iid` names the validation split; choose another name")
        return name


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
    stop_below_gain: StrictFloat = Field(default=0.01, ge=0, le=1)
    """Scale-or-stop: recommend stopping once even the upper end of the interval of the pass-rate gain from 10x
    more compute is below this (or below the validation noise, whichever is larger)."""
    model_discrepancy: StrictFloat = Field(default=0.025, ge=0, le=1)
    """sd of the curve's departure from the fitted sigmoid per e-fold of compute past the fit window, as a share
    of the fitted gain A - R0, added to every prediction's interval beyond the window (0: the bootstrap alone).
    The default is calibrated on the platform's recorded runs (docs/benchmarks/forecast.md, session 23)."""


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
    prompt: PromptConfig = PromptConfig()
    learner: LearnerConfig = LearnerConfig()
    seed: Annotated[StrictInt, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _cross_field_checks(self) -> "Recipe":
        g = self.generation
        if g.thinking_budget_low > g.thinking_budget_high:
            raise ValueError("generation.thinking_budget_low must be <= generation.thinking_budget_high")
        if self.budget.max_steps is None and self.budget.compute_device_hours is None:
            raise ValueError("budget: set max_steps or compute_device_hours so the job can end")
        if self.data.retired_recheck_fraction > 0 and self.data.no_positive_resampling_threshold is None:
            raise ValueError("data.retired_recheck_fraction rechecks retired prompts, and "
                             "data.no_positive_resampling_threshold is None (nothing is retired): set one of them")
        if self.validation.num_prompts > self.task.num_validation_prompts:
            raise ValueError("validation.num_prompts must be <= task.num_validation_prompts")
        for i, s in enumerate(self.validation.eval_sets):
            if s.dataset is not None and self.task.dataset is not None and (
                    os.path.realpath(s.dataset.path) == os.path.realpath(self.task.dataset.path)):
                raise ValueError(f"validation.eval_sets.{i}.dataset.path: the job trains on {s.dataset.path!r} and a "
                                 "file set evaluates every record; use the iid validation split for this file")
        if g.forced_interruption:
            phrase = phrase_token_bound(g.interruption_phrase, self.model.path)
            need = g.thinking_budget_high + phrase + g.solution_budget + 1
            if need > self.model.max_model_len:
                raise ValueError(
                    f"generation.thinking_budget_high ({g.thinking_budget_high}) + generation.interruption_phrase "
                    f"(<= {phrase} tokens) + generation.solution_budget ({g.solution_budget}) + 1 prompt token = "
                    f"{need} does not fit model.max_model_len ({self.model.max_model_len}): interruption could "
                    "not fire; lower the budgets, shorten the phrase or raise max_model_len")
        return self


def phrase_token_bound(phrase: str, model_path: str) -> int:
    """Tokens the interruption phrase takes, at most. The model's tokenizer is not available where recipes are
    validated (the api has no model), so: the character count for the builtin tiny model's character
    tokenizer (exact), else the UTF-8 byte count + 1 -- a byte-level BPE (SmolLM2, Llama 3, Qwen) never needs
    more tokens than bytes, and the 1 covers a SentencePiece word-start marker. SmolLM2 takes 20 tokens for
    the default 81-byte phrase. The generator measures the exact count and leaves out a phrase that does not
    fit the room a long prompt leaves."""
    if model_path == "builtin:tiny-arithmetic":
        return len(phrase)
    return len(phrase.encode("utf-8")) + 1


def parse_recipe(data: dict | str) -> Recipe:
    """Validate a recipe from a dict or its JSON; raises pydantic.ValidationError naming the field."""
    if isinstance(data, str):
        return Recipe.model_validate_json(data)
    return Recipe.model_validate(data)
