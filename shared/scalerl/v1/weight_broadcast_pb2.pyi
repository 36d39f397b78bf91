from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class WeightChunk(_message.Message):
    __slots__ = ("job_id", "version", "index", "total_chunks", "total_bytes", "sha256", "data", "pinned")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    index: int
    total_chunks: int
    total_bytes: int
    sha256: str
    data: bytes
    pinned: bool
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., index: _Optional[int] = ..., total_chunks: _Optional[int] = ..., total_bytes: _Optional[int] = ..., sha256: _Optional[str] = ..., data: _Optional[bytes] = ..., pinned: _Optional[bool] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("version", "total_bytes")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    version: int
    total_bytes: int
    def __init__(self, version: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("job_id", "subscriber_id", "have_version")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_VERSION_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    subscriber_id: str
    have_version: int
    def __init__(self, job_id: _Optional[str] = ..., subscriber_id: _Optional[str] = ..., have_version: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("job_id", "version", "release")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    release: bool
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., release: _Optional[bool] = ...) -> None: ...

class GetLatestRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class VersionInfo(_message.Message):
    __slots__ = ("job_id", "version", "sha256", "total_bytes", "subscribers")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    sha256: str
    total_bytes: int
    subscribers: int
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., sha256: _Optional[str] = ..., total_bytes: _Optional[int] = ..., subscribers: _Optional[int] = ...) -> None: ...
