from scalerl.v1 import common_pb2 as _common_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LearnerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LearnerStatus(_message.Message):
    __slots__ = ("job_id", "step", "policy_version", "compute", "last_step_seconds", "phase")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    LAST_STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    policy_version: int
    compute: _common_pb2.ComputeSplit
    last_step_seconds: float
    phase: str
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., policy_version: _Optional[int] = ..., compute: _Optional[_Union[_common_pb2.ComputeSplit, _Mapping]] = ..., last_step_seconds: _Optional[float] = ..., phase: _Optional[str] = ...) -> None: ...
