from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_INTERRUPTED: _ClassVar[FinishReason]
    FINISH_REASON_ABORTED: _ClassVar[FinishReason]

class GradeStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GRADE_STATUS_UNSPECIFIED: _ClassVar[GradeStatus]
    GRADE_STATUS_GRADED: _ClassVar[GradeStatus]
    GRADE_STATUS_FAILED: _ClassVar[GradeStatus]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_INTERRUPTED: FinishReason
FINISH_REASON_ABORTED: FinishReason
GRADE_STATUS_UNSPECIFIED: GradeStatus
GRADE_STATUS_GRADED: GradeStatus
GRADE_STATUS_FAILED: GradeStatus

class Job(_message.Message):
    __slots__ = ("job_id", "recipe_json", "state")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RECIPE_JSON_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    recipe_json: str
    state: str
    def __init__(self, job_id: _Optional[str] = ..., recipe_json: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("job_id", "prompt_id", "text", "task", "answer", "metadata_json", "epoch")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    prompt_id: str
    text: str
    task: str
    answer: str
    metadata_json: str
    epoch: int
    def __init__(self, job_id: _Optional[str] = ..., prompt_id: _Optional[str] = ..., text: _Optional[str] = ..., task: _Optional[str] = ..., answer: _Optional[str] = ..., metadata_json: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class VersionSpan(_message.Message):
    __slots__ = ("version", "start", "end")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    version: int
    start: int
    end: int
    def __init__(self, version: _Optional[int] = ..., start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("token_ids", "logprobs", "versions", "loss_mask", "finish_reason", "text")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    versions: _containers.RepeatedCompositeFieldContainer[VersionSpan]
    loss_mask: _containers.RepeatedScalarFieldContainer[bool]
    finish_reason: FinishReason
    text: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., versions: _Optional[_Iterable[_Union[VersionSpan, _Mapping]]] = ..., loss_mask: _Optional[_Iterable[bool]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., text: _Optional[str] = ...) -> None: ...

class ScoredCompletion(_message.Message):
    __slots__ = ("completion", "reward", "grade_status", "grade_error")
    COMPLETION_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    GRADE_STATUS_FIELD_NUMBER: _ClassVar[int]
    GRADE_ERROR_FIELD_NUMBER: _ClassVar[int]
    completion: Completion
    reward: float
    grade_status: GradeStatus
    grade_error: str
    def __init__(self, completion: _Optional[_Union[Completion, _Mapping]] = ..., reward: _Optional[float] = ..., grade_status: _Optional[_Union[GradeStatus, str]] = ..., grade_error: _Optional[str] = ...) -> None: ...

class ScoredGroup(_message.Message):
    __slots__ = ("job_id", "group_id", "prompt", "prompt_token_ids", "completions", "generator_id", "device_seconds", "lease_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    group_id: str
    prompt: Prompt
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    completions: _containers.RepeatedCompositeFieldContainer[ScoredCompletion]
    generator_id: str
    device_seconds: float
    lease_id: str
    def __init__(self, job_id: _Optional[str] = ..., group_id: _Optional[str] = ..., prompt: _Optional[_Union[Prompt, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., completions: _Optional[_Iterable[_Union[ScoredCompletion, _Mapping]]] = ..., generator_id: _Optional[str] = ..., device_seconds: _Optional[float] = ..., lease_id: _Optional[str] = ...) -> None: ...

class ComputeSplit(_message.Message):
    __slots__ = ("learner_device_hours", "generator_device_hours", "evaluator_device_hours", "generated_tokens")
    LEARNER_DEVICE_HOURS_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_DEVICE_HOURS_FIELD_NUMBER: _ClassVar[int]
    EVALUATOR_DEVICE_HOURS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    learner_device_hours: float
    generator_device_hours: float
    evaluator_device_hours: float
    generated_tokens: int
    def __init__(self, learner_device_hours: _Optional[float] = ..., generator_device_hours: _Optional[float] = ..., evaluator_device_hours: _Optional[float] = ..., generated_tokens: _Optional[int] = ...) -> None: ...

class ValidationPoint(_message.Message):
    __slots__ = ("job_id", "step", "policy_version", "compute", "value", "split", "num_prompts", "samples_per_prompt")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    policy_version: int
    compute: float
    value: float
    split: ComputeSplit
    num_prompts: int
    samples_per_prompt: int
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., compute: _Optional[float] = ..., value: _Optional[float] = ..., split: _Optional[_Union[ComputeSplit, _Mapping]] = ..., num_prompts: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ...) -> None: ...
