from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class GeneratorStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GeneratorStatus(_message.Message):
    __slots__ = ("generator_id", "role", "job_id", "policy_version", "groups_in_flight", "tokens_generated")
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_GENERATED_FIELD_NUMBER: _ClassVar[int]
    generator_id: str
    role: str
    job_id: str
    policy_version: int
    groups_in_flight: int
    tokens_generated: int
    def __init__(self, generator_id: _Optional[str] = ..., role: _Optional[str] = ..., job_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., groups_in_flight: _Optional[int] = ..., tokens_generated: _Optional[int] = ...) -> None: ...

class EvaluateRequest(_message.Message):
    __slots__ = ("job_id", "policy_version", "num_prompts", "samples_per_prompt", "eval_set")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    EVAL_SET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    policy_version: int
    num_prompts: int
    samples_per_prompt: int
    eval_set: str
    def __init__(self, job_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., num_prompts: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., eval_set: _Optional[str] = ...) -> None: ...

class EvaluateResponse(_message.Message):
    __slots__ = ("job_id", "policy_version", "pass_rate", "num_prompts", "samples_per_prompt", "device_seconds", "completions_graded", "completions_failed_to_grade")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PASS_RATE_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_GRADED_FIELD_NUMBER: _ClassVar[int]
    COMPLETIONS_FAILED_TO_GRADE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    policy_version: int
    pass_rate: float
    num_prompts: int
    samples_per_prompt: int
    device_seconds: float
    completions_graded: int
    completions_failed_to_grade: int
    def __init__(self, job_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., pass_rate: _Optional[float] = ..., num_prompts: _Optional[int] = ..., samples_per_prompt: _Optional[int] = ..., device_seconds: _Optional[float] = ..., completions_graded: _Optional[int] = ..., completions_failed_to_grade: _Optional[int] = ...) -> None: ...
