from scalerl.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetActiveJobRequest(_message.Message):
    __slots__ = ("requester",)
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    requester: str
    def __init__(self, requester: _Optional[str] = ...) -> None: ...

class ActiveJob(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _common_pb2.Job
    def __init__(self, job: _Optional[_Union[_common_pb2.Job, _Mapping]] = ...) -> None: ...

class JobProgress(_message.Message):
    __slots__ = ("job_id", "step", "policy_version", "compute", "last_pass_rate")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    LAST_PASS_RATE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    policy_version: int
    compute: _common_pb2.ComputeSplit
    last_pass_rate: float
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., compute: _Optional[_Union[_common_pb2.ComputeSplit, _Mapping]] = ..., last_pass_rate: _Optional[float] = ...) -> None: ...

class ReportProgressResponse(_message.Message):
    __slots__ = ("keep_running",)
    KEEP_RUNNING_FIELD_NUMBER: _ClassVar[int]
    keep_running: bool
    def __init__(self, keep_running: _Optional[bool] = ...) -> None: ...

class FinishJobRequest(_message.Message):
    __slots__ = ("job_id", "state", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: str
    reason: str
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FinishJobResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
