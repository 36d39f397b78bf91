from scalerl.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AddPointRequest(_message.Message):
    __slots__ = ("point", "recipe_json", "eval_set")
    POINT_FIELD_NUMBER: _ClassVar[int]
    RECIPE_JSON_FIELD_NUMBER: _ClassVar[int]
    EVAL_SET_FIELD_NUMBER: _ClassVar[int]
    point: _common_pb2.ValidationPoint
    recipe_json: str
    eval_set: str
    def __init__(self, point: _Optional[_Union[_common_pb2.ValidationPoint, _Mapping]] = ..., recipe_json: _Optional[str] = ..., eval_set: _Optional[str] = ...) -> None: ...

class GetForecastRequest(_message.Message):
    __slots__ = ("job_id", "eval_set")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EVAL_SET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    eval_set: str
    def __init__(self, job_id: _Optional[str] = ..., eval_set: _Optional[str] = ...) -> None: ...

class GetCurveRequest(_message.Message):
    __slots__ = ("job_id", "eval_set")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    EVAL_SET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    eval_set: str
    def __init__(self, job_id: _Optional[str] = ..., eval_set: _Optional[str] = ...) -> None: ...

class Curve(_message.Message):
    __slots__ = ("job_id", "points", "eval_set", "eval_sets")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    EVAL_SET_FIELD_NUMBER: _ClassVar[int]
    EVAL_SETS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    points: _containers.RepeatedCompositeFieldContainer[_common_pb2.ValidationPoint]
    eval_set: str
    eval_sets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., points: _Optional[_Iterable[_Union[_common_pb2.ValidationPoint, _Mapping]]] = ..., eval_set: _Optional[str] = ..., eval_sets: _Optional[_Iterable[str]] = ...) -> None: ...

class GetCorrelationsRequest(_message.Message):
    __slots__ = ("job_id", "level")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    level: float
    def __init__(self, job_id: _Optional[str] = ..., level: _Optional[float] = ...) -> None: ...

class SetCorrelation(_message.Message):
    __slots__ = ("eval_set", "num_versions", "spearman", "interval", "enough_points", "note")
    EVAL_SET_FIELD_NUMBER: _ClassVar[int]
    NUM_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    SPEARMAN_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    ENOUGH_POINTS_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    eval_set: str
    num_versions: int
    spearman: float
    interval: Interval
    enough_points: bool
    note: str
    def __init__(self, eval_set: _Optional[str] = ..., num_versions: _Optional[int] = ..., spearman: _Optional[float] = ..., interval: _Optional[_Union[Interval, _Mapping]] = ..., enough_points: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...

class Correlations(_message.Message):
    __slots__ = ("job_id", "level", "sets")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    SETS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    level: float
    sets: _containers.RepeatedCompositeFieldContainer[SetCorrelation]
    def __init__(self, job_id: _Optional[str] = ..., level: _Optional[float] = ..., sets: _Optional[_Iterable[_Union[SetCorrelation, _Mapping]]] = ...) -> None: ...

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
    __slots__ = ("job_id", "model", "a", "b", "c_mid", "r0", "intervals", "predictions", "identifiable", "warnings", "num_points", "compute_to_target", "decision")
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
    DECISION_FIELD_NUMBER: _ClassVar[int]
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
    decision: Decision
    def __init__(self, job_id: _Optional[str] = ..., model: _Optional[str] = ..., a: _Optional[float] = ..., b: _Optional[float] = ..., c_mid: _Optional[float] = ..., r0: _Optional[float] = ..., intervals: _Optional[_Mapping[str, Interval]] = ..., predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ..., identifiable: _Optional[bool] = ..., warnings: _Optional[_Iterable[str]] = ..., num_points: _Optional[int] = ..., compute_to_target: _Optional[float] = ..., decision: _Optional[_Union[Decision, _Mapping]] = ...) -> None: ...

class GetDecisionRequest(_message.Message):
    __slots__ = ("job_id", "target")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    target: float
    def __init__(self, job_id: _Optional[str] = ..., target: _Optional[float] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("job_id", "spent", "predictions", "gain", "gain_interval", "target", "compute_to_target", "compute_to_target_interval", "recommendation", "reason", "compute_to_identify", "identifiable", "level")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SPENT_FIELD_NUMBER: _ClassVar[int]
    PREDICTIONS_FIELD_NUMBER: _ClassVar[int]
    GAIN_FIELD_NUMBER: _ClassVar[int]
    GAIN_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TO_TARGET_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TO_TARGET_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    RECOMMENDATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TO_IDENTIFY_FIELD_NUMBER: _ClassVar[int]
    IDENTIFIABLE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    spent: float
    predictions: _containers.RepeatedCompositeFieldContainer[Prediction]
    gain: float
    gain_interval: Interval
    target: float
    compute_to_target: float
    compute_to_target_interval: Interval
    recommendation: str
    reason: str
    compute_to_identify: float
    identifiable: bool
    level: float
    def __init__(self, job_id: _Optional[str] = ..., spent: _Optional[float] = ..., predictions: _Optional[_Iterable[_Union[Prediction, _Mapping]]] = ..., gain: _Optional[float] = ..., gain_interval: _Optional[_Union[Interval, _Mapping]] = ..., target: _Optional[float] = ..., compute_to_target: _Optional[float] = ..., compute_to_target_interval: _Optional[_Union[Interval, _Mapping]] = ..., recommendation: _Optional[str] = ..., reason: _Optional[str] = ..., compute_to_identify: _Optional[float] = ..., identifiable: _Optional[bool] = ..., level: _Optional[float] = ...) -> None: ...

class CompareRequest(_message.Message):
    __slots__ = ("job_ids", "level")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[str]
    level: float
    def __init__(self, job_ids: _Optional[_Iterable[str]] = ..., level: _Optional[float] = ...) -> None: ...

class ParamDiff(_message.Message):
    __slots__ = ("name", "a", "b", "diff", "interval", "significant")
    NAME_FIELD_NUMBER: _ClassVar[int]
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    DIFF_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    SIGNIFICANT_FIELD_NUMBER: _ClassVar[int]
    name: str
    a: float
    b: float
    diff: float
    interval: Interval
    significant: bool
    def __init__(self, name: _Optional[str] = ..., a: _Optional[float] = ..., b: _Optional[float] = ..., diff: _Optional[float] = ..., interval: _Optional[_Union[Interval, _Mapping]] = ..., significant: _Optional[bool] = ...) -> None: ...

class Band(_message.Message):
    __slots__ = ("compute", "fit", "lower", "upper")
    COMPUTE_FIELD_NUMBER: _ClassVar[int]
    FIT_FIELD_NUMBER: _ClassVar[int]
    LOWER_FIELD_NUMBER: _ClassVar[int]
    UPPER_FIELD_NUMBER: _ClassVar[int]
    compute: _containers.RepeatedScalarFieldContainer[float]
    fit: _containers.RepeatedScalarFieldContainer[float]
    lower: _containers.RepeatedScalarFieldContainer[float]
    upper: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, compute: _Optional[_Iterable[float]] = ..., fit: _Optional[_Iterable[float]] = ..., lower: _Optional[_Iterable[float]] = ..., upper: _Optional[_Iterable[float]] = ...) -> None: ...

class ComparedJob(_message.Message):
    __slots__ = ("job_id", "forecast", "points", "band")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FORECAST_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    BAND_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    forecast: Forecast
    points: _containers.RepeatedCompositeFieldContainer[_common_pb2.ValidationPoint]
    band: Band
    def __init__(self, job_id: _Optional[str] = ..., forecast: _Optional[_Union[Forecast, _Mapping]] = ..., points: _Optional[_Iterable[_Union[_common_pb2.ValidationPoint, _Mapping]]] = ..., band: _Optional[_Union[Band, _Mapping]] = ...) -> None: ...

class Comparison(_message.Message):
    __slots__ = ("jobs", "params", "higher_ceiling", "more_efficient", "verdict", "level", "ceiling_p", "efficiency_p", "summary", "notes", "warnings")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    HIGHER_CEILING_FIELD_NUMBER: _ClassVar[int]
    MORE_EFFICIENT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    CEILING_P_FIELD_NUMBER: _ClassVar[int]
    EFFICIENCY_P_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[ComparedJob]
    params: _containers.RepeatedCompositeFieldContainer[ParamDiff]
    higher_ceiling: str
    more_efficient: str
    verdict: str
    level: float
    ceiling_p: float
    efficiency_p: float
    summary: str
    notes: _containers.RepeatedScalarFieldContainer[str]
    warnings: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, jobs: _Optional[_Iterable[_Union[ComparedJob, _Mapping]]] = ..., params: _Optional[_Iterable[_Union[ParamDiff, _Mapping]]] = ..., higher_ceiling: _Optional[str] = ..., more_efficient: _Optional[str] = ..., verdict: _Optional[str] = ..., level: _Optional[float] = ..., ceiling_p: _Optional[float] = ..., efficiency_p: _Optional[float] = ..., summary: _Optional[str] = ..., notes: _Optional[_Iterable[str]] = ..., warnings: _Optional[_Iterable[str]] = ...) -> None: ...
