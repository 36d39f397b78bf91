"""Versions as fixed-size chunks: one fast integrity pass, delta streams, and the store every relay point shares.

A version's blob is cut into `chunk_bytes` chunks. Each chunk travels with its xxh3-64 and is verified the moment
it arrives (no pass over the whole blob); the last message carries an xxh3-128 over the chunk hashes, so a
version is whole and in order when that matches. A delta stream names a base version and sends only the chunks
that changed, each either whole or as a sparse patch of 16-bit words (bf16 steps change few of them); the chunk
hash is of the chunk *after* patching, so the receiver's result is checked bit for bit.

`VersionStore` + `stream_frames` are what the weight-broadcast hub and every generator's relay serve: a version
is forwarded chunk by chunk while it is still arriving (pipelined), as the very bytes that were received.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Union

import numpy as np
import xxhash
from google.protobuf.message import DecodeError

from scalerl import errors
from scalerl.cpus import usable_cpus
from scalerl.v1 import weight_broadcast_pb2 as pb

chunk_hash = xxhash.xxh3_64_intdigest

DELTA_THREADS = min(8, usable_cpus())
"""Threads that find a delta's changed words (numpy lets go of the GIL there): the learner's delta costs ~0.6 s
of one core per GiB (docs/benchmarks/weights.md)."""
VERIFY_THREADS = min(8, usable_cpus() - 2)
"""Threads that check arriving chunks against their hashes (xxhash lets go of the GIL), so a node verifies at
several cores' speed rather than one's while its receiving and forwarding threads keep theirs; 1 or less: each
chunk is checked on the thread that receives it (no pool: on a 2-core box the handoff costs more than it frees)."""
_pools: dict[str, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(name: str, threads: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(threads, thread_name_prefix=f"weights-{name}")
        return _pools[name]


def _forget_pools() -> None:  # a forked child has the pool objects but none of their threads
    global _pools, _pools_lock
    _pools, _pools_lock = {}, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def _in_parallel(fn: Callable[[range], list], n: int) -> list:
    """fn over [0, n) split in contiguous ranges, on the delta threads; the results concatenated in order."""
    if DELTA_THREADS <= 1 or n < 2:
        return fn(range(n))
    step = -(-n // (4 * DELTA_THREADS))
    parts = _pool("delta", DELTA_THREADS).map(fn, [range(i, min(i + step, n)) for i in range(0, n, step)])
    return [r for part in parts for r in part]


def version_digest(hashes, total_bytes: int) -> bytes:
    """xxh3-128 over the chunk hashes (little-endian uint64) and the blob size: a tree hash of the version."""
    return xxhash.xxh3_128_digest(np.asarray(hashes, dtype="<u8").tobytes() + total_bytes.to_bytes(8, "little"))


def split(blob: bytes, chunk_bytes: int) -> tuple[memoryview, ...]:
    """Views into `blob`, no copies."""
    view = memoryview(blob)
    return tuple(view[i:i + chunk_bytes] for i in range(0, len(blob), chunk_bytes)) or (view,)


# ------------------------------------------------------------------------------------------------ frames
# A frame is a serialized WeightChunk whose `data` field is written first (protobuf accepts fields in any order),
# so the receiver takes the data as a view of the received bytes and parses only the small header after it; the
# hub and the relays forward the received bytes untouched. A WeightChunk serialized the usual way parses too.
_DATA_TAG = (7 << 3) | 2


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def encode_frame(header: pb.WeightChunk, data) -> bytes:
    """`header` (its data unset) with `data`: one copy of the data."""
    return grpc_frame((header.SerializeToString(), data))


def decode_frame(raw: bytes) -> tuple[pb.WeightChunk, memoryview | bytes]:
    """(header, data): the data is a view of `raw` when the frame was written by `encode_frame`."""
    try:
        return _decode_frame(raw)
    except DecodeError as err:
        raise errors.InvalidArgument(f"not a WeightChunk ({err})", field="chunk") from None


def _decode_frame(raw: bytes) -> tuple[pb.WeightChunk, memoryview | bytes]:
    if raw[:1] == bytes((_DATA_TAG,)):
        n, shift, i = 0, 0, 1
        while i < len(raw):
            byte = raw[i]
            n |= (byte & 0x7F) << shift
            i += 1
            if not byte & 0x80:
                break
            shift += 7
        if i + n <= len(raw):
            header = pb.WeightChunk.FromString(raw[i + n:])
            if not header.data:  # a frame that set data twice is not ours: parse it whole
                return header, memoryview(raw)[i:i + n]
    chunk = pb.WeightChunk.FromString(raw)
    return chunk, chunk.data


# A message as a store keeps it, to forward as received: a gRPC frame, or (serialized header, data) as the raw TCP
# data plane (`scalerl.weights.tcp`) carries it, the data a view of the version's receive buffer.
Message = Union[bytes, tuple[bytes, "memoryview | bytes"]]
Wire = Literal["grpc", "tcp"]


def grpc_frame(message: Message) -> bytes:
    """The message as a gRPC frame (`encode_frame`'s layout: data first, then the serialized header)."""
    if isinstance(message, bytes):
        return message
    header, data = message
    return b"".join((bytes((_DATA_TAG,)), _varint(len(data)), data, header))


def tcp_message(message: Message) -> tuple[bytes, "memoryview | bytes"]:
    if isinstance(message, tuple):
        return message
    header, data = decode_frame(message)
    return header.SerializeToString(), data


def message_size(message: Message) -> int:
    return len(message) if isinstance(message, bytes) else len(message[0]) + len(message[1])


class BufferPool:
    """Receive buffers reused across versions, so a version lands in memory that is already mapped (a fresh
    64 MiB costs more in page faults than the loopback copy itself). A buffer is reused once nothing but the pool
    refers to it: no stored version, no consumer's blob or tensors (which hold views of it).

    The pool keeps every buffer it handed out that is still in use (holding one costs nothing: its holder keeps
    it alive anyway) and at most `max_buffers` spare ones. Bounding all of them instead left a store holding more
    than `max_buffers` versions (another job's, pins) with no spare ever again: every version then arrived in
    fresh memory, its page faults paid at chunk 0 before anything was forwarded."""

    def __init__(self, max_buffers: int = 8):
        self.max_buffers = max_buffers
        self._buffers: list[bytearray] = []
        self._lock = threading.Lock()
        self.allocated = 0
        """Buffers allocated so far (a test and the benchmark read it)."""

    def take(self, size: int) -> bytearray:
        with self._lock:
            chosen, spares = None, []
            for i in range(len(self._buffers)):
                buf = self._buffers[i]
                if sys.getrefcount(buf) == 3:  # the list, `buf`, getrefcount's argument: nobody else
                    if chosen is None and len(buf) == size:
                        chosen = buf
                    else:
                        spares.append(i)
                del buf
            for i in reversed(spares[:max(0, len(spares) - self.max_buffers)]):
                del self._buffers[i]  # the oldest spares beyond the bound go
            if chosen is not None:
                return chosen
            try:
                fresh = bytearray(size)
            except MemoryError:
                raise errors.ResourceExhausted(f"no memory for a {size}-byte version",
                                               field="total_bytes") from None
            self.allocated += 1
            self._buffers.append(fresh)
            return fresh


# ------------------------------------------------------------------------------------------------ sparse patches
PAGE_WORDS = 1 << 16
"""16-bit words per page of a paged sparse patch: offsets within a page fit 16 bits."""


def sparse_patch(old: bytes, new: bytes) -> bytes | None:
    """`new` as the changed 16-bit words of `old` (same size), paged (CHUNK_ENCODING_SPARSE_PAGED: 4 bytes per
    changed word), or None when sending `new` whole is smaller."""
    if len(old) != len(new) or len(new) % 2:
        return None
    a, b = np.frombuffer(old, dtype="<u2"), np.frombuffer(new, dtype="<u2")
    where = np.flatnonzero(a != b)  # integer compare: -0.0 vs 0.0 and NaN payloads count as changes
    pages = -(-len(a) // PAGE_WORDS)
    if 4 + 4 * pages + 4 * len(where) >= len(new):
        return None
    counts = np.bincount(where >> 16, minlength=pages).astype("<u4")
    return (len(where).to_bytes(4, "little") + counts.tobytes() + (where & 0xFFFF).astype("<u2").tobytes()
            + b[where].tobytes())


def apply_sparse(old: bytes, patch: bytes, paged: bool = True) -> bytes:
    """`old` patched: paged (CHUNK_ENCODING_SPARSE_PAGED) or, from an older publisher, with 32-bit offsets
    (CHUNK_ENCODING_SPARSE: u32 n, n u32 offsets, n u16 words)."""
    _check_words(old)
    words = np.frombuffer(old, dtype="<u2").copy()
    _scatter(words, patch, len(old), paged)
    return words.tobytes()


def apply_sparse_into(target: memoryview, patch: bytes, paged: bool = True) -> None:
    """Patch `target` (writable, holding the base chunk) in place: no copy of the chunk."""
    _check_words(target)
    _scatter(np.frombuffer(target, dtype="<u2"), patch, len(target), paged)


def _check_words(chunk) -> None:
    if len(chunk) % 2:
        raise errors.InvalidArgument(f"a sparse patch needs whole 16-bit words; the chunk has {len(chunk)} bytes",
                                     field="data")


def _scatter(words: np.ndarray, patch: bytes, size: int, paged: bool) -> None:
    n = int.from_bytes(patch[:4], "little") if len(patch) >= 4 else -1
    words_in_chunk = size // 2
    pages = -(-words_in_chunk // PAGE_WORDS)
    expected = 4 + 4 * pages + 4 * n if paged else 4 + 6 * n
    if n < 0 or len(patch) != expected:
        raise errors.InvalidArgument(f"malformed sparse patch ({len(patch)} bytes)", field="data")
    if paged:
        counts = np.frombuffer(patch, dtype="<u4", count=pages, offset=4).astype(np.int64)
        if int(counts.sum()) != n:
            raise errors.InvalidArgument("sparse patch page counts do not add up", field="data")
        page_of = np.repeat(np.arange(pages, dtype=np.int64), counts)
        where = page_of * PAGE_WORDS + np.frombuffer(patch, dtype="<u2", count=n, offset=4 + 4 * pages)
        values_at = 4 + 4 * pages + 2 * n
    else:
        where = np.frombuffer(patch, dtype="<u4", count=n, offset=4)
        values_at = 4 + 4 * n
    if n and int(where.max()) >= words_in_chunk:
        raise errors.InvalidArgument("sparse patch offset past the chunk", field="data")
    words[where] = np.frombuffer(patch, dtype="<u2", count=n, offset=values_at)


# ------------------------------------------------------------------------------------------------ versions
@dataclass
class ChunkedVersion:
    """One whole, verified version."""

    job_id: str
    version: int
    total_bytes: int
    chunk_bytes: int
    parts: tuple[bytes, ...]
    hashes: tuple[int, ...]
    digest: bytes
    delta: tuple[int, tuple[bytes, ...]] | None = None
    """(base version, the delta stream's messages as they arrived): sent as-is to a subscriber holding the base."""
    buffer: bytearray | None = field(default=None, repr=False)
    """The one contiguous buffer every part is a view of (versions received over the TCP data plane)."""
    _frames: tuple[Message, ...] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_blob(cls, job_id: str, version: int, blob: bytes, chunk_bytes: int) -> "ChunkedVersion":
        parts = split(blob, chunk_bytes)
        hashes = tuple(chunk_hash(p) for p in parts)
        return cls(job_id, version, len(blob), chunk_bytes, parts, hashes, version_digest(hashes, len(blob)))

    @property
    def blob(self) -> bytes | memoryview:
        """The version's bytes: a read-only view of the receive buffer when there is one (no copy; the buffer is
        not reused while the view lives), else joined."""
        if self.buffer is not None:
            return memoryview(self.buffer).toreadonly()
        return b"".join(self.parts)  # bytes, also for one part (the parts may be views)

    def headers(self, pinned: bool = False) -> Iterator[tuple[pb.WeightChunk, memoryview | bytes]]:
        """(header, data) of every chunk: the whole version."""
        return _whole_headers(self, self.hashes.__getitem__, lambda: self.digest, pinned)

    def result(self) -> "ChunkedVersion":
        return self

    def messages(self, pinned: bool = False) -> Iterator[pb.WeightChunk]:
        """As plain WeightChunk messages (tests; the wire uses `frames`)."""
        for header, data in self.headers(pinned):
            header.data = bytes(data)
            yield header

    def frames(self, pinned: bool = False) -> Iterator[bytes]:
        for header, data in self.headers(pinned):
            yield encode_frame(header, data)

    def tcp_messages(self, pinned: bool = False) -> Iterator[tuple[bytes, memoryview | bytes]]:
        """The whole version for the TCP data plane: headers serialized, the data as views (no copy)."""
        for header, data in self.headers(pinned):
            yield header.SerializeToString(), data

    def delta_messages(self, base: "ChunkedVersion", pinned: bool = False) -> list[pb.WeightChunk] | None:
        delta = self.delta_headers(base, pinned)
        if delta is None:
            return None
        for header, data in delta:
            header.data = bytes(data)
        return [h for h, _ in delta]

    def delta_frames(self, base: "ChunkedVersion", pinned: bool = False) -> list[bytes] | None:
        delta = self.delta_headers(base, pinned)
        return None if delta is None else [encode_frame(h, d) for h, d in delta]

    def delta_headers(self, base: "ChunkedVersion", pinned: bool = False
                      ) -> list[tuple[pb.WeightChunk, memoryview | bytes]] | None:
        """The changed chunks against `base` (whole or sparse), or None when base does not fit this version."""
        if (base.total_bytes, base.chunk_bytes) != (self.total_bytes, self.chunk_bytes):
            return None
        def changed(indices: range) -> list[tuple[int, bytes | None]]:
            return [(i, sparse_patch(base.parts[i], self.parts[i])) for i in indices
                    if not (self.hashes[i] == base.hashes[i] and self.parts[i] == base.parts[i])]

        out = []
        for i, patch in _in_parallel(changed, len(self.parts)):
            out.append((pb.WeightChunk(
                job_id=self.job_id, version=self.version, index=i, total_chunks=len(self.parts),
                total_bytes=self.total_bytes, chunk_bytes=self.chunk_bytes, chunk_hash=self.hashes[i],
                pinned=pinned, base_version=base.version,
                encoding=pb.CHUNK_ENCODING_FULL if patch is None else pb.CHUNK_ENCODING_SPARSE_PAGED),
                self.parts[i] if patch is None else patch))
        if not out:  # nothing changed: one message still carries the digest
            out.append((pb.WeightChunk(job_id=self.job_id, version=self.version, index=0,
                                       total_chunks=len(self.parts), total_bytes=self.total_bytes,
                                       chunk_bytes=self.chunk_bytes, chunk_hash=self.hashes[0], pinned=pinned,
                                       base_version=base.version), self.parts[0]))
        for seq, (msg, _) in enumerate(out):
            msg.seq, msg.messages = seq, len(out)
        out[-1][0].digest = self.digest
        return out

    def full_frames(self) -> tuple[Message, ...]:
        """The whole version as serialized messages, built once and sent as-is to every subscriber."""
        with self._lock:
            if self._frames is None:
                self._frames = tuple(self.frames())
            return self._frames

    def drop_frames(self) -> None:
        with self._lock:
            self._frames = None
            self.delta = None


def _whole_headers(v: "ChunkedVersion | HashingAhead", hash_of: Callable[[int], int], digest: Callable[[], bytes],
                   pinned: bool) -> Iterator[tuple[pb.WeightChunk, memoryview | bytes]]:
    total = len(v.parts)
    for i, data in enumerate(v.parts):
        yield pb.WeightChunk(job_id=v.job_id, version=v.version, index=i, total_chunks=total,
                             total_bytes=v.total_bytes, chunk_bytes=v.chunk_bytes, chunk_hash=hash_of(i), seq=i,
                             messages=total, pinned=pinned, digest=digest() if i == total - 1 else b""), data


class HashingAhead:
    """A whole version to publish whose chunk hashes a helper thread computes while the chunks before them are
    sent (xxhash and a socket send both let go of the GIL), so the first chunk leaves at once rather than after
    a pass over the whole version (0.16 s per GiB on one core of an H200 machine). `result()` is the
    ChunkedVersion, once every hash is in."""

    def __init__(self, job_id: str, version: int, blob: bytes, chunk_bytes: int):
        self.job_id, self.version, self.total_bytes, self.chunk_bytes = job_id, version, len(blob), chunk_bytes
        self.parts = split(blob, chunk_bytes)
        self._hashes = [0] * len(self.parts)
        self._done = 0
        self._error: BaseException | None = None
        self._result: ChunkedVersion | None = None
        self._cond = threading.Condition()
        threading.Thread(target=self._hash_all, daemon=True, name="weights-hash").start()

    def _hash_all(self) -> None:
        try:
            for i, part in enumerate(self.parts):
                h = chunk_hash(part)
                with self._cond:
                    self._hashes[i] = h
                    self._done = i + 1
                    self._cond.notify_all()
        except BaseException as err:  # noqa: BLE001 - handed to the thread that waits for the hash
            with self._cond:
                self._error = err
                self._cond.notify_all()

    def hash_of(self, index: int) -> int:
        with self._cond:
            self._cond.wait_for(lambda: self._done > index or self._error is not None)
            if self._done > index:
                return self._hashes[index]
            raise self._error

    def headers(self, pinned: bool = False) -> Iterator[tuple[pb.WeightChunk, memoryview | bytes]]:
        return _whole_headers(self, self.hash_of, lambda: self.result().digest, pinned)

    def result(self) -> ChunkedVersion:
        if self._result is None:
            hashes = tuple(self.hash_of(i) for i in range(len(self.parts)))
            self._result = ChunkedVersion(self.job_id, self.version, self.total_bytes, self.chunk_bytes, self.parts,
                                          hashes, version_digest(hashes, self.total_bytes))
        return self._result


class Incoming:
    """A version while its messages arrive: each is verified, applied and kept (as the bytes received) so it can
    be forwarded before the rest arrives."""

    def __init__(self, first: pb.WeightChunk, base: ChunkedVersion | None, streamed: bool = True,
                 pool: BufferPool | None = None):
        self.job_id, self.version = first.job_id, first.version
        self.total_bytes, self.chunk_bytes = first.total_bytes, first.chunk_bytes
        self.total_chunks, self.messages = first.total_chunks, first.messages
        self.base_version = first.base_version if first.HasField("base_version") else None
        self.pinned = first.pinned
        self.streamed = streamed
        """False for a re-published older version: held as a pin only, never streamed."""
        if self.chunk_bytes <= 0 or self.total_bytes < 0 or self.messages <= 0:
            raise errors.InvalidArgument("chunk_bytes, total_bytes and messages must be set", field="chunk_bytes",
                                         job_id=self.job_id)
        expected = max(1, -(-self.total_bytes // self.chunk_bytes))
        if self.total_chunks != expected:
            raise errors.InvalidArgument(f"got {self.total_chunks}, {self.total_bytes} bytes in "
                                         f"{self.chunk_bytes}-byte chunks make {expected}", field="total_chunks",
                                         job_id=self.job_id)
        if base is not None and (base.total_bytes, base.chunk_bytes) != (self.total_bytes, self.chunk_bytes):
            raise errors.InvalidArgument(f"base v{base.version} has another size", field="base_version",
                                         job_id=self.job_id)
        self.buffer: bytearray | None = None
        """With a pool: the version is assembled in one buffer (chunks are received straight into `slot`)."""
        if pool is not None:
            self.buffer = pool.take(self.total_bytes)
            view = memoryview(self.buffer)
            self.slots = [view[i * self.chunk_bytes:i * self.chunk_bytes + self._chunk_size(i)]
                          for i in range(expected)]
        self._base = base if self.buffer is not None else None
        self._from_base = 0
        """With a buffer and a base: chunks [0, _from_base) hold their base bytes or what arrived for them. The
        base is copied in as the messages pass each index, not all at `begin`: a relay forwards a delta's first
        message after one chunk's work instead of a whole version's copy, so a chain does not add that copy per
        hop (docs/benchmarks/weights.md)."""
        if base is not None:
            self.parts: list = list(self.slots if self.buffer is not None else base.parts)
            self.hashes: list = list(base.hashes)
        else:
            self.parts, self.hashes = [None] * expected, [0] * expected
        self.frames: list[Message] = []
        """The messages checked so far, in order: what relays forward."""
        self._received = 0
        self._checking: deque[tuple[Future, pb.WeightChunk, Message, object]] = deque()
        """Messages whose chunk the verify threads are checking, in arrival order."""
        self._passing = threading.Lock()
        self._recheck = False
        self.failed_check: BaseException | None = None
        """The error of a chunk that failed its check on a verify thread: raised by the receiving thread's next
        `add`, or by the receiver woken from waiting (`wake_on_failure`)."""
        self.wake_on_failure: Callable[[], None] | None = None
        """Set by a receiver that can be woken from waiting for the next message when a check fails (the TCP
        plane shuts its socket's reading side); only then are chunks checked on the verify threads."""
        self.cond = threading.Condition()
        self.result: ChunkedVersion | None = None
        self.error: BaseException | None = None

    def _chunk_size(self, index: int) -> int:
        return min(self.chunk_bytes, self.total_bytes - index * self.chunk_bytes) if self.total_bytes else 0

    def slot(self, chunk: pb.WeightChunk) -> memoryview | None:
        """Where a whole chunk's data can be received in place (the TCP data plane), if this version has a
        buffer and the header is plausible; `add` then verifies it there."""
        if (self.buffer is None or chunk.encoding != pb.CHUNK_ENCODING_FULL
                or not 0 <= chunk.index < self.total_chunks):
            return None
        return self.slots[chunk.index]

    def add(self, raw: Message | None, chunk: pb.WeightChunk, data=None) -> ChunkedVersion | None:
        """Verify and apply one message (`data`: its data when `chunk` is a header only, possibly received in
        place in `slot(chunk)`); the whole version once the last one is in. With VERIFY_THREADS > 1 and a
        `wake_on_failure`, a chunk is checked on the verify threads while the next ones arrive, and is forwarded
        (appended to `frames`) once it and every chunk before it have passed: relays never forward a chunk that
        failed, and the receiver is woken to raise the failure."""
        where = f"weights v{self.version} message {chunk.seq}"
        if (chunk.job_id, chunk.version) != (self.job_id, self.version):
            raise errors.InvalidArgument("must be the same in every chunk", field="job_id/version", job_id=self.job_id)
        if chunk.seq != self._received or chunk.messages != self.messages:
            raise errors.InvalidArgument(f"{where}: expected message {self._received} of {self.messages}",
                                         field="seq", job_id=self.job_id)
        if not 0 <= chunk.index < self.total_chunks:
            raise errors.InvalidArgument(f"{where}: chunk {chunk.index} out of range", field="index",
                                         job_id=self.job_id)
        payload = chunk.data if data is None else data
        if raw is None:  # built here (tests, Fetch of a re-published pin): one frame as the others
            raw = chunk.SerializeToString() if data is None else encode_frame(chunk, payload)
        data = payload
        sparse = chunk.encoding in (pb.CHUNK_ENCODING_SPARSE, pb.CHUNK_ENCODING_SPARSE_PAGED)
        if sparse and self.base_version is None:
            raise errors.InvalidArgument(f"{where}: a sparse chunk needs a base", field="encoding",
                                         job_id=self.job_id)
        self._copy_base(chunk.index, this_one=sparse)
        if sparse:
            paged = chunk.encoding == pb.CHUNK_ENCODING_SPARSE_PAGED
            if self.buffer is not None:
                apply_sparse_into(self.slots[chunk.index], data, paged=paged)
                data = self.slots[chunk.index]
            else:
                data = apply_sparse(self.parts[chunk.index], data, paged=paged)
        if len(data) != self._chunk_size(chunk.index):
            raise errors.InvalidArgument(f"{where}: chunk {chunk.index} has {len(data)} bytes, expected "
                                         f"{self._chunk_size(chunk.index)}", field="data", job_id=self.job_id)
        self._received += 1
        last = chunk.seq == self.messages - 1
        if not last and VERIFY_THREADS > 1 and self.wake_on_failure is not None:
            check = _pool("verify", VERIFY_THREADS).submit(chunk_hash, data)
            with self._passing:
                self._checking.append((check, chunk, raw, data))
            check.add_done_callback(self._pass_checked)
            self._pass_checked()  # what a check that ended while the queue was held left to pass
            self._raise_failed_check()
            return None
        if self._checking:  # only this thread adds to it: empty here means no check is pending
            with self._passing:
                checking = [check for check, *_ in self._checking]
            for check in checking:  # every chunk before the last is checked, and passed on below
                check.exception()
            with self._passing:
                self._pass_ready()
            self._raise_failed_check()
        self._check(chunk_hash(data), chunk)
        self._store(chunk, data)
        if last:
            missing = [i for i, p in enumerate(self.parts) if p is None]
            if missing:
                raise errors.InvalidArgument(f"weights v{self.version}: chunks {missing[:5]} never arrived",
                                             field="index", job_id=self.job_id)
            if version_digest(self.hashes, self.total_bytes) != chunk.digest:
                raise errors.InvalidArgument(f"weights v{self.version}: digest mismatch", field="digest",
                                             job_id=self.job_id)
        self._forward(raw)  # relays forward the last message before the rest of the base is copied
        if last:
            self._copy_base(self.total_chunks, this_one=False)
            with self.cond:
                self.result = ChunkedVersion(
                    self.job_id, self.version, self.total_bytes, self.chunk_bytes, tuple(self.parts),
                    tuple(self.hashes), bytes(chunk.digest),
                    delta=None if self.base_version is None else (self.base_version, tuple(self.frames)),
                    buffer=self.buffer)
                if self.base_version is None:
                    self.result._frames = tuple(self.frames)  # received whole: forwarded as received
                self.cond.notify_all()
        return self.result

    def _pass_checked(self, _check: Future | None = None) -> None:
        """Store and forward, in arrival order, the chunks whose check has passed: run by each check as it ends
        (on a verify thread) and by the receiving thread. Whoever finds another thread passing leaves it a note
        (`_recheck`) so that a check ending meanwhile is not left waiting for the next message."""
        self._recheck = True
        while self._recheck and self._passing.acquire(blocking=False):
            try:
                self._recheck = False
                self._pass_ready()
            finally:
                self._passing.release()

    def _pass_ready(self) -> None:
        """The passing itself, with `_passing` held."""
        while self.failed_check is None and self.error is None and self._checking and self._checking[0][0].done():
            check, chunk, raw, data = self._checking[0]
            try:
                self._check(check.result(), chunk)
            except BaseException as err:  # noqa: BLE001 - raised by the receiving thread's next add
                self.failed_check = err
                self._wake()
                return
            self._checking.popleft()
            self._store(chunk, data)
            self._forward(raw)

    def _raise_failed_check(self) -> None:
        if self.failed_check is not None:
            raise self.failed_check

    def _wake(self) -> None:
        try:
            self.wake_on_failure()
        except OSError:
            pass

    def _check(self, got_hash: int, chunk: pb.WeightChunk) -> None:
        if got_hash != chunk.chunk_hash:
            raise errors.InvalidArgument(f"weights v{self.version} message {chunk.seq}: chunk {chunk.index} does not "
                                         "match its hash (corrupted)", field="chunk_hash", job_id=self.job_id)

    def _store(self, chunk: pb.WeightChunk, data) -> None:
        if self.buffer is not None:
            slot = self.slots[chunk.index]
            if not (isinstance(data, memoryview) and data.obj is self.buffer):
                slot[:] = data
            data = slot
        self.parts[chunk.index] = data
        self.hashes[chunk.index] = chunk.chunk_hash

    def _forward(self, raw: Message) -> None:
        with self.cond:
            self.frames.append(raw)
            self.cond.notify_all()

    def _copy_base(self, index: int, this_one: bool) -> None:
        """Base bytes into the chunks before `index` not yet filled, and into chunk `index` itself when its
        message is a patch (a whole chunk is received into its slot, or copied there, by `add`)."""
        if self._base is None or index < self._from_base:
            return
        for i in range(self._from_base, min(index + this_one, self.total_chunks)):
            self.slots[i][:] = self._base.parts[i]
        self._from_base = min(index + 1, self.total_chunks)
        if self._from_base == self.total_chunks and index >= self.total_chunks:
            self._base = None  # all copied: the base's buffer may be reused once its own holders let go

    def fail(self, error: BaseException) -> None:
        self._base = None
        with self._passing:  # no check passing now can forward after this, nor wake the socket's next version
            with self.cond:
                self.error = error
                self.cond.notify_all()

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def wait_done(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.done, timeout=timeout)

    def frames_from(self, alive: Callable[[], bool], poll_s: float = 0.5) -> Iterator[Message]:
        """Every message as it arrives; raises FailedPrecondition when the upload broke off."""
        i = 0
        while True:
            with self.cond:
                self.cond.wait_for(lambda: len(self.frames) > i or self.error is not None, timeout=poll_s)
                if self.error is not None:
                    raise errors.FailedPrecondition(f"weights v{self.version}: upload broke off ({self.error})",
                                             job_id=self.job_id)
                batch = self.frames[i:]
            if not batch and not alive():
                return
            yield from batch
            i += len(batch)
            if i == self.messages:
                return


# ------------------------------------------------------------------------------------------------ store
class VersionStore:
    """Whole versions per job (the last `keep_versions`, plus pins), and the one arriving now."""

    def __init__(self, keep_versions: int = 4, max_pinned: int = 16, pool: BufferPool | None = None):
        self.keep_versions = keep_versions
        self.max_pinned = max_pinned
        self.pool = pool if pool is not None else BufferPool(max_buffers=keep_versions + 2)
        """Receive buffers of the versions that arrive over the TCP data plane."""
        self._jobs: dict[str, OrderedDict[int, ChunkedVersion]] = {}
        self._pinned: dict[str, OrderedDict[int, ChunkedVersion]] = {}
        self._incoming: dict[str, Incoming] = {}
        self._cond = threading.Condition()

    def _latest(self, job_id: str) -> ChunkedVersion | None:
        versions = self._jobs.get(job_id)
        return versions[next(reversed(versions))] if versions else None

    def latest(self, job_id: str) -> ChunkedVersion | None:
        with self._cond:
            return self._latest(job_id)

    def get(self, job_id: str, version: int, release: bool = False) -> ChunkedVersion | None:
        with self._cond:
            pins = self._pinned.get(job_id, {})
            pinned = pins.pop(version, None) if release else pins.get(version)
            return pinned or self._jobs.get(job_id, {}).get(version)

    def require(self, job_id: str, version: int, release: bool = False) -> ChunkedVersion:
        entry = self.get(job_id, version, release=release)
        if entry is None:
            raise errors.NotFound(f"job {job_id!r} has no version {version} (kept: last {self.keep_versions})",
                                  field="version", job_id=job_id)
        return entry

    def begin(self, first: pb.WeightChunk, contiguous: bool = False) -> Incoming:
        """Start receiving a version (its first message); refused when it cannot become one. `contiguous`:
        assembled in one buffer from the pool (the TCP data plane receives chunks straight into it)."""
        if not first.job_id:
            raise errors.InvalidArgument("is required", field="job_id")
        with self._cond:
            latest = self._latest(first.job_id)
            streamed = latest is None or first.version > latest.version
            if not streamed and not first.pinned:
                raise errors.InvalidArgument(f"{first.version} is not newer than the latest published "
                                             f"{latest.version}", field="version", job_id=first.job_id)
            base = None
            if first.HasField("base_version"):
                base = self.get(first.job_id, first.base_version)
                if base is None:
                    raise errors.NotFound(f"delta base v{first.base_version} is not held here",
                                          field="base_version", job_id=first.job_id)
            incoming = Incoming(first, base, streamed=streamed, pool=self.pool if contiguous else None)
            if streamed:
                self._incoming[first.job_id] = incoming
                self._cond.notify_all()
            return incoming

    def complete(self, incoming: Incoming) -> ChunkedVersion:
        entry = incoming.result
        assert entry is not None
        with self._cond:
            if self._incoming.get(entry.job_id) is incoming:
                del self._incoming[entry.job_id]
            if incoming.pinned:
                pins = self._pinned.setdefault(entry.job_id, OrderedDict())
                pins[entry.version] = entry
                while len(pins) > self.max_pinned:
                    pins.popitem(last=False)
            latest = self._latest(entry.job_id)
            if incoming.streamed and (latest is None or entry.version > latest.version):
                if latest is not None:
                    latest.drop_frames()  # only the latest is streamed; a Fetch of an older one re-serializes
                versions = self._jobs.setdefault(entry.job_id, OrderedDict())
                versions[entry.version] = entry
                while len(versions) > self.keep_versions:
                    versions.popitem(last=False)
            self._cond.notify_all()
        return entry

    def abort(self, incoming: Incoming, error: BaseException) -> None:
        incoming.fail(error)
        with self._cond:
            if self._incoming.get(incoming.job_id) is incoming:
                del self._incoming[incoming.job_id]
            self._cond.notify_all()

    def next_for(self, job_id: str, have_version: int, timeout: float) -> Incoming | ChunkedVersion | None:
        """The newest version past `have_version`: one still arriving if it is the newest, else the latest."""

        def newest():
            incoming = self._incoming.get(job_id)
            if incoming is not None and incoming.version > have_version and incoming.error is None:
                return incoming
            latest = self._latest(job_id)
            return latest if latest is not None and latest.version > have_version else None

        with self._cond:
            self._cond.wait_for(lambda: newest() is not None, timeout=timeout)
            return newest()

    def wait_complete(self, job_id: str, have_version: int, timeout: float) -> ChunkedVersion | None:
        with self._cond:
            self._cond.wait_for(lambda: (v := self._latest(job_id)) is not None and v.version > have_version,
                                timeout=timeout)
            latest = self._latest(job_id)
            return latest if latest is not None and latest.version > have_version else None

    def job_ids(self) -> set[str]:
        with self._cond:
            return set(self._jobs) | set(self._pinned) | set(self._incoming)

    def drop_job(self, job_id: str) -> None:
        with self._cond:
            self._jobs.pop(job_id, None)
            self._pinned.pop(job_id, None)
            self._incoming.pop(job_id, None)


def stream_frames(store: VersionStore, job_id: str, have_version: int, alive: Callable[[], bool],
                  poll_s: float = 0.5, sent: Callable[[int], None] | None = None, wire: Wire = "grpc"
                  ) -> Iterator[Message]:
    """Subscribe's body at the hub and at every relay: the newest version past `have_version` (pipelined while
    it arrives; as a delta when the subscriber holds its base), then each later one. Messages are gRPC frames
    or, for `wire="tcp"`, (header, data) pairs; either is forwarded as received when it arrived that way."""
    convert = grpc_frame if wire == "grpc" else tcp_message
    have = have_version
    while alive():
        item = store.next_for(job_id, have, timeout=poll_s)
        if item is None:
            continue
        if isinstance(item, Incoming):
            if item.base_version is None or item.base_version == have:
                frames = item.frames_from(alive, poll_s)
            else:  # a delta on a version this subscriber lacks: the whole version once it is in
                while not item.wait_done(poll_s):
                    if not alive():
                        return
                if item.result is None:
                    continue
                frames = _whole(item.result, wire)
        else:
            delta = item.delta
            frames = iter(delta[1]) if delta is not None and delta[0] == have else _whole(item, wire)
        for frame in frames:
            frame = convert(frame)
            yield frame
            if sent is not None:
                sent(message_size(frame))
        have = item.version


def _whole(entry: ChunkedVersion, wire: Wire) -> Iterator[Message]:
    if wire == "tcp" and entry._frames is None:
        return entry.tcp_messages()  # views of the parts: nothing to build
    return iter(entry.full_frames())
