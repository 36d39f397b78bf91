from scalerl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InitJobRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ...) -> None: ...

class InitJobResponse(_message.Message):
    __slots__ = ("pool_size", "created")
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    pool_size: int
    created: bool
    def __init__(self, pool_size: _Optional[int] = ..., created: _Optional[bool] = ...) -> None: ...

class LeasePromptsRequest(_message.Message):
    __slots__ = ("job_id", "generator_id", "max_prompts", "lease_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    generator_id: str
    max_prompts: int
    lease_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., generator_id: _Optional[str] = ..., max_prompts: _Optional[int] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class LeasePromptsResponse(_message.Message):
    __slots__ = ("prompts", "lease_id", "slow_down", "retry_after_s", "exhausted")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SLOW_DOWN_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[_common_pb2.Prompt]
    lease_id: str
    slow_down: bool
    retry_after_s: float
    exhausted: bool
    def __init__(self, prompts: _Optional[_Iterable[_Union[_common_pb2.Prompt, _Mapping]]] = ..., lease_id: _Optional[str] = ..., slow_down: _Optional[bool] = ..., retry_after_s: _Optional[float] = ..., exhausted: _Optional[bool] = ...) -> None: ...

class RenewLeasesRequest(_message.Message):
    __slots__ = ("job_id", "lease_id", "prompt_ids", "lease_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    lease_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    lease_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[str]] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class RenewLeasesResponse(_message.Message):
    __slots__ = ("lost_prompt_ids",)
    LOST_PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    lost_prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lost_prompt_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WriteGroupsRequest(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[_common_pb2.ScoredGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[_common_pb2.ScoredGroup, _Mapping]]] = ...) -> None: ...

class WriteGroupsResponse(_message.Message):
    __slots__ = ("written", "dropped_zero_variance", "dropped_failed_to_grade", "lost_lease")
    WRITTEN_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ZERO_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FAILED_TO_GRADE_FIELD_NUMBER: _ClassVar[int]
    LOST_LEASE_FIELD_NUMBER: _ClassVar[int]
    written: int
    dropped_zero_variance: int
    dropped_failed_to_grade: int
    lost_lease: int
    def __init__(self, written: _Optional[int] = ..., dropped_zero_variance: _Optional[int] = ..., dropped_failed_to_grade: _Optional[int] = ..., lost_lease: _Optional[int] = ...) -> None: ...

class ReadBatchRequest(_message.Message):
    __slots__ = ("job_id", "consumer", "max_groups", "learner_version", "block_ms")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    LEARNER_VERSION_FIELD_NUMBER: _ClassVar[int]
    BLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    consumer: str
    max_groups: int
    learner_version: int
    block_ms: int
    def __init__(self, job_id: _Optional[str] = ..., consumer: _Optional[str] = ..., max_groups: _Optional[int] = ..., learner_version: _Optional[int] = ..., block_ms: _Optional[int] = ...) -> None: ...

class BufferedGroup(_message.Message):
    __slots__ = ("entry_id", "group", "redelivered")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    REDELIVERED_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    group: _common_pb2.ScoredGroup
    redelivered: bool
    def __init__(self, entry_id: _Optional[str] = ..., group: _Optional[_Union[_common_pb2.ScoredGroup, _Mapping]] = ..., redelivered: _Optional[bool] = ...) -> None: ...

class ReadBatchResponse(_message.Message):
    __slots__ = ("groups", "dropped_stale")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[BufferedGroup]
    dropped_stale: int
    def __init__(self, groups: _Optional[_Iterable[_Union[BufferedGroup, _Mapping]]] = ..., dropped_stale: _Optional[int] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("job_id", "entry_ids", "trained")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    TRAINED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    trained: bool
    def __init__(self, job_id: _Optional[str] = ..., entry_ids: _Optional[_Iterable[str]] = ..., trained: _Optional[bool] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class BufferStats(_message.Message):
    __slots__ = ("job_id", "groups_written", "groups_trained", "dropped_stale", "dropped_zero_variance", "dropped_failed_to_grade", "pending", "pool_size", "retired_prompts", "epoch", "generator_device_seconds", "generated_tokens", "oldest_pending_version", "lost_lease", "leased")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    GROUPS_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    GROUPS_TRAINED_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_ZERO_VARIANCE_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FAILED_TO_GRADE_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    POOL_SIZE_FIELD_NUMBER: _ClassVar[int]
    RETIRED_PROMPTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GENERATOR_DEVICE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OLDEST_PENDING_VERSION_FIELD_NUMBER: _ClassVar[int]
    LOST_LEASE_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    groups_written: int
    groups_trained: int
    dropped_stale: int
    dropped_zero_variance: int
    dropped_failed_to_grade: int
    pending: int
    pool_size: int
    retired_prompts: int
    epoch: int
    generator_device_seconds: float
    generated_tokens: int
    oldest_pending_version: int
    lost_lease: int
    leased: int
    def __init__(self, job_id: _Optional[str] = ..., groups_written: _Optional[int] = ..., groups_trained: _Optional[int] = ..., dropped_stale: _Optional[int] = ..., dropped_zero_variance: _Optional[int] = ..., dropped_failed_to_grade: _Optional[int] = ..., pending: _Optional[int] = ..., pool_size: _Optional[int] = ..., retired_prompts: _Optional[int] = ..., epoch: _Optional[int] = ..., generator_device_seconds: _Optional[float] = ..., generated_tokens: _Optional[int] = ..., oldest_pending_version: _Optional[int] = ..., lost_lease: _Optional[int] = ..., leased: _Optional[int] = ...) -> None: ...

class CleanupJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class CleanupJobResponse(_message.Message):
    __slots__ = ("keys_deleted",)
    KEYS_DELETED_FIELD_NUMBER: _ClassVar[int]
    keys_deleted: int
    def __init__(self, keys_deleted: _Optional[int] = ...) -> None: ...
