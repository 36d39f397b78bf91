from scalerl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AddPointRequest(_message.Message):
    __slots__ = ("point", "recipe_json")
    POINT_FIELD_NUMBER: _ClassVar[int]
    RECIPE_JSON_FIELD_NUMBER: _ClassVar[int]
    point: _common_pb2.ValidationPoint
    recipe_json: str
    def __init__(self, point: _Optional[_Union[_common_pb2.ValidationPoint, _Mapping]] = ..., recipe_json: _Optional[str] = ...) -> None: ...

class GetForecastRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class GetCurveRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class Curve(_message.Message):
    __slots__ = ("job_id", "points")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    points: _containers.RepeatedCompositeFieldContainer[_common_pb2.ValidationPoint]
    def __init__(self, job_id: _Optional[str] = ..., points: _Optional[_Iterable[_Union[_common_pb2.ValidationPoint, _Mapping]]] = ...) -> None: ...

class Interval(_message.Message):
    __slots__ = ("lo", "hi")
    LO_FIELD_NUMBER: _ClassVar[int]
    HI_FIELD_NUMBER: _ClassVar[int]
    lo: float
    hi: float
    def __init__(self, lo: _Optional[float] = ..., hi: _Optional[float] = ...) -> None: ...

class Prediction(_message.Message):
    __slots__ = ("compute", "value", "interval")
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    compute: float
    value: float
    interval: Interval
    def __init__(self, compute: _Optional[float] = ..., value: _Optional[float] = ..., interval: _Optional[_Union[Interval, _Mapping]] = ...) -> None: ...

class Forecast(_message.Message):
    __slots__ = ("job_id", "model", "a", "b", "c_mid", "r0", "intervals", "predictions", "identifiable", "warnings", "num_points", "compute_to_target")
    class IntervalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Interval
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Interval, _Mapping]] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    C_MID_FIELD_NUMBER: _ClassVar[int]
    R0_FIELD_NUMBER: _ClassVar[int]
    INTERVALS_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    IDENTIFIABLE_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    NUM_POINTS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TO_TARGET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    model: str
    a: float
    b: float
    c_mid: float
    r0: float
    intervals: _containers.MessageMap[str, Interval]
    predictions: _containers.RepeatedCompositeFieldContainer[Prediction]
    identifiable: bool
    warnings: _containers.RepeatedScalarFieldContainer[str]
    num_points: int
    compute_to_target: float
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., a: _Optional[float] = ..., b: _Optional[float] = ..., c_mid: _Optional[float] = ..., r0: _Optional[float] = ..., intervals: _Optional[_Mapping[str, Interval]] = ..., predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ..., identifiable: _Optional[bool] = ..., warnings: _Optional[_Iterable[str]] = ..., num_points: _Optional[int] = ..., compute_to_target: _Optional[float] = ...) -> None: ...
