from scalerl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GradeItem(_message.Message):
    __slots__ = ("task", "answer", "response", "metadata_json")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    METADATA_JSON_FIELD_NUMBER: _ClassVar[int]
    task: str
    answer: str
    response: str
    metadata_json: str
    def __init__(self, task: _Optional[str] = ..., answer: _Optional[str] = ..., response: _Optional[str] = ..., metadata_json: _Optional[str] = ...) -> None: ...

class GradeRequest(_message.Message):
    __slots__ = ("job_id", "items", "timeout_s")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    items: _containers.RepeatedCompositeFieldContainer[GradeItem]
    timeout_s: float
    def __init__(self, job_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[GradeItem, _Mapping]]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class GradeResult(_message.Message):
    __slots__ = ("reward", "status", "error")
    REWARD_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    reward: float
    status: _common_pb2.GradeStatus
    error: str
    def __init__(self, reward: _Optional[float] = ..., status: _Optional[_Union[_common_pb2.GradeStatus, str]] = ..., error: _Optional[str] = ...) -> None: ...

class GradeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GradeResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GradeResult, _Mapping]]] = ...) -> None: ...
