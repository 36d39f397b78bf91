"""The chunk format of weight versions: sparse 16-bit-word patches and per-chunk verification."""

from __future__ import annotations

import os
import signal
import struct
import threading
import time

import numpy as np
import pytest

from scalerl import errors
from scalerl.v1 import weight_broadcast_pb2 as pb
from scalerl.weights import chunked
from scalerl.weights.chunked import (BufferPool, ChunkedVersion, HashingAhead, Incoming, VersionStore, apply_sparse,
                                     apply_sparse_into, sparse_patch)
from scalerl.weights.grpc import receive


def frames(messages):
    return [m.SerializeToString() for m in messages]


def test_a_sparse_patch_restores_every_bit():
    old = os.urandom(4096)
    new = bytearray(old)
    new[100:102] = struct.pack("<e", -0.0)  # -0.0 where there may have been +0.0
    new[200:202] = b"\x7f\xc1"  # a NaN payload
    new[4094] ^= 1
    patch = sparse_patch(old, bytes(new))
    assert patch is not None and len(patch) == 4 + 4 + 4 * 3  # count, one page's count, 3 x (offset, word)
    assert apply_sparse(old, patch) == bytes(new)


def test_a_paged_patch_spans_pages_and_the_older_format_still_applies():
    old = os.urandom(1 << 20)  # 8 pages of 65536 words
    new = bytearray(old)
    for i in (0, 131071 * 2, 131072 * 2, 300000 * 2, (1 << 20) - 2):  # around page edges, the last word
        new[i] ^= 0xA5
    patch = sparse_patch(old, bytes(new))
    assert len(patch) == 4 + 4 * 8 + 4 * 5
    assert apply_sparse(old, patch) == bytes(new)
    a, b = np.frombuffer(old, "<u2"), np.frombuffer(bytes(new), "<u2")
    where = np.flatnonzero(a != b)  # CHUNK_ENCODING_SPARSE, as a publisher before the paged format sends it
    legacy = len(where).to_bytes(4, "little") + where.astype("<u4").tobytes() + b[where].tobytes()
    assert apply_sparse(old, legacy, paged=False) == bytes(new)


def test_a_dense_change_is_sent_whole():
    old = os.urandom(4096)
    assert sparse_patch(old, os.urandom(4096)) is None
    assert sparse_patch(old, old[:-1]) is None  # another size
    assert sparse_patch(b"abc", b"abd") is None  # odd: no 16-bit words


def _delta_on_chunks(changed: tuple[int, ...], chunks: int = 8, size: int = 4096):
    base_blob = os.urandom(chunks * size)
    new = bytearray(base_blob)
    for i in changed:
        new[i * size + 10] ^= 1  # one 16-bit word: a sparse patch
    base = ChunkedVersion.from_blob("j", 1, base_blob, size)
    return base, bytes(new), ChunkedVersion.from_blob("j", 2, bytes(new), size).delta_headers(base)


def test_a_delta_copies_its_base_as_its_messages_pass_not_all_when_it_starts():
    """A receiver on the TCP plane assembles a delta in its own buffer: the base, patched. Copying the whole base
    when the first message arrived put a whole version's copy before any hop could forward that message, once per
    hop of a chain (64 MiB, 4 generators: chunk 0 reached the last one after 120 ms, 48 ms without;
    docs/benchmarks/weights.md). After message 0 the chunks past it are untouched; after the last the version
    is bit-exact, patched in the buffer, and the base is unchanged."""
    base, new, delta = _delta_on_chunks((0, 5))
    assert [(h.index, h.encoding) for h, _ in delta] == [(0, pb.CHUNK_ENCODING_SPARSE_PAGED),
                                                          (5, pb.CHUNK_ENCODING_SPARSE_PAGED)]
    base_bytes = bytes(base.blob)
    incoming = Incoming(delta[0][0], base, pool=BufferPool(max_buffers=1))  # a fresh buffer: zeros
    assert incoming.add(None, *delta[0]) is None
    assert bytes(incoming.buffer[4096:]) == bytes(7 * 4096)
    result = incoming.add(None, *delta[1])
    assert bytes(result.blob) == new and bytes(base.blob) == base_bytes
    assert result.parts[0].obj is incoming.buffer  # patched where it lies, not copied in


def test_a_delta_whose_messages_come_out_of_index_order_is_still_bit_exact():
    base, new, delta = _delta_on_chunks((1, 6))
    digest = delta[-1][0].digest
    swapped = [delta[1], delta[0]]
    for seq, (header, _) in enumerate(swapped):
        header.seq = seq
        header.digest = digest if seq == len(swapped) - 1 else b""
    incoming = Incoming(swapped[0][0], base, pool=BufferPool(max_buffers=1))
    incoming.add(None, *swapped[0])
    assert bytes(incoming.add(None, *swapped[1]).blob) == new


def test_a_patch_applied_in_place_equals_the_copying_one():
    old = os.urandom(1 << 20)
    new = bytearray(old)
    for i in (0, 131072 * 2, (1 << 20) - 2):
        new[i] ^= 0x5A
    patch = sparse_patch(old, bytes(new))
    target = bytearray(old)
    apply_sparse_into(memoryview(target), patch)
    assert bytes(target) == apply_sparse(old, patch) == bytes(new)


def test_a_whole_version_hashed_ahead_hands_out_chunk_0_before_the_rest_is_hashed(monkeypatch):
    """The publisher's first chunk leaves while a helper thread still hashes the others (before, the whole
    version was hashed first: 0.16 s per GiB on an H200 machine's core before a byte moved). The headers and the
    version that result are those of `ChunkedVersion.from_blob`."""
    blob = os.urandom(6 * 4096 + 10)
    real, gate, hashed = chunked.chunk_hash, threading.Event(), []

    def held_after_the_first(data):
        if threading.current_thread().name == "weights-hash" and hashed:
            gate.wait(30)
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(chunked, "chunk_hash", held_after_the_first)
    ahead = HashingAhead("j", 3, blob, 4096)
    headers = ahead.headers(pinned=True)
    first, data = next(headers)
    assert not gate.is_set() and len(hashed) == 1  # chunk 1's hash is still held back
    gate.set()
    eager = ChunkedVersion.from_blob("j", 3, blob, 4096)
    assert [h for h, _ in [(first, data), *headers]] == [h for h, _ in eager.headers(pinned=True)]
    result = ahead.result()
    assert (result.hashes, result.digest, bytes(result.blob)) == (eager.hashes, eager.digest, blob)


def test_a_patch_on_a_chunk_of_odd_size_is_refused_naming_the_field():
    for apply in (lambda: apply_sparse(b"abc", bytes(8)), lambda: apply_sparse_into(memoryview(bytearray(3)), bytes(8))):
        with pytest.raises(errors.InvalidArgument) as err:
            apply()
        assert err.value.field == "data"


def test_the_delta_threads_work_in_a_forked_child(monkeypatch):
    """A forked child inherits the thread pool's object but none of its threads: without a fresh pool its first
    delta waits forever."""
    monkeypatch.setattr(chunked, "DELTA_THREADS", 4)
    base, new, _ = _delta_on_chunks((1, 6))
    ChunkedVersion.from_blob("j", 2, new, 4096).delta_headers(base)  # the parent's pool is up
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once its delta is made
        try:
            ChunkedVersion.from_blob("j", 2, new, 4096).delta_headers(base)
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's delta never finished")


@pytest.mark.parametrize("patch", [
    b"", b"\x01\x00\x00\x00", b"\x01\x00\x00\x00" + b"\xff" * 6,
    (1).to_bytes(4, "little") + (0).to_bytes(4, "little") + b"\x01\x00\xff\xff",  # page counts do not add up
    (1).to_bytes(4, "little") + (1).to_bytes(4, "little") + (40).to_bytes(2, "little") + b"\xff\xff",  # past it
])
def test_a_malformed_patch_is_refused(patch):
    with pytest.raises(errors.InvalidArgument):
        apply_sparse(bytes(64), patch)


def test_delta_messages_skip_unchanged_chunks_and_apply_bit_exact():
    base = ChunkedVersion.from_blob("j", 1, os.urandom(10 * 1024 + 6), 1024)
    blob = bytearray(base.blob)
    blob[5000] ^= 0x80
    blob[-1] ^= 1
    new = ChunkedVersion.from_blob("j", 2, bytes(blob), 1024)
    delta = new.delta_messages(base)
    assert [m.index for m in delta] == [4, 10] and [m.seq for m in delta] == [0, 1]
    store = VersionStore()
    got = list(receive(list(base.frames()) + frames(delta), store))
    assert [v.version for v in got] == [1, 2] and got[1].blob == bytes(blob)


@pytest.mark.parametrize("damage,field", [("flip", "chunk_hash"), ("drop", "seq"), ("digest", "digest"),
                                          ("truncate", "data")])
def test_damage_in_transit_is_detected_as_the_chunk_arrives(damage, field):
    messages = list(ChunkedVersion.from_blob("j", 1, os.urandom(5000), 1024).messages())
    if damage == "flip":
        messages[2].data = messages[2].data[:5] + bytes([messages[2].data[5] ^ 4]) + messages[2].data[6:]
    elif damage == "drop":
        del messages[3]
    elif damage == "digest":
        messages[-1].digest = bytes(16)
    else:
        messages[1].data = messages[1].data[:-2]
    with pytest.raises(errors.InvalidArgument) as err:
        list(receive(frames(messages)))
    assert err.value.field == field


def test_a_version_of_one_chunk_is_handed_over_as_bytes():
    blob = os.urandom(100)
    got = next(receive(list(ChunkedVersion.from_blob("j", 1, blob, 1024).frames())))
    assert type(got.blob) is bytes and got.blob == blob


def test_bytes_that_are_no_chunk_are_invalid_argument():
    with pytest.raises(errors.InvalidArgument) as err:
        list(receive([b"\xff\xff\xff\xff"]))
    assert err.value.field == "chunk"
