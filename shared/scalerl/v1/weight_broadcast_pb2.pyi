from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChunkEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHUNK_ENCODING_FULL: _ClassVar[ChunkEncoding]
    CHUNK_ENCODING_SPARSE: _ClassVar[ChunkEncoding]
    CHUNK_ENCODING_SPARSE_PAGED: _ClassVar[ChunkEncoding]
CHUNK_ENCODING_FULL: ChunkEncoding
CHUNK_ENCODING_SPARSE: ChunkEncoding
CHUNK_ENCODING_SPARSE_PAGED: ChunkEncoding

class WeightChunk(_message.Message):
    __slots__ = ("job_id", "version", "index", "total_chunks", "total_bytes", "data", "pinned", "chunk_bytes", "chunk_hash", "seq", "messages", "base_version", "encoding", "digest")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    PINNED_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_HASH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    index: int
    total_chunks: int
    total_bytes: int
    data: bytes
    pinned: bool
    chunk_bytes: int
    chunk_hash: int
    seq: int
    messages: int
    base_version: int
    encoding: ChunkEncoding
    digest: bytes
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., index: _Optional[int] = ..., total_chunks: _Optional[int] = ..., total_bytes: _Optional[int] = ..., data: _Optional[bytes] = ..., pinned: _Optional[bool] = ..., chunk_bytes: _Optional[int] = ..., chunk_hash: _Optional[int] = ..., seq: _Optional[int] = ..., messages: _Optional[int] = ..., base_version: _Optional[int] = ..., encoding: _Optional[_Union[ChunkEncoding, str]] = ..., digest: _Optional[bytes] = ...) -> None: ...

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
    __slots__ = ("job_id", "version", "digest", "total_bytes", "subscribers", "data_port")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    DATA_PORT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    version: int
    digest: str
    total_bytes: int
    subscribers: int
    data_port: int
    def __init__(self, job_id: _Optional[str] = ..., version: _Optional[int] = ..., digest: _Optional[str] = ..., total_bytes: _Optional[int] = ..., subscribers: _Optional[int] = ..., data_port: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("job_id", "subscriber_id", "relay_addr", "failed_parent")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_ID_FIELD_NUMBER: _ClassVar[int]
    RELAY_ADDR_FIELD_NUMBER: _ClassVar[int]
    FAILED_PARENT_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    subscriber_id: str
    relay_addr: str
    failed_parent: str
    def __init__(self, job_id: _Optional[str] = ..., subscriber_id: _Optional[str] = ..., relay_addr: _Optional[str] = ..., failed_parent: _Optional[str] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("parent_addr", "depth")
    PARENT_ADDR_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    parent_addr: str
    depth: int
    def __init__(self, parent_addr: _Optional[str] = ..., depth: _Optional[int] = ...) -> None: ...
