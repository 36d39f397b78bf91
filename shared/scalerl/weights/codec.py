"""Named tensors <-> safetensors bytes: the wire format of the gRPC and filesystem transports."""

from __future__ import annotations

import hashlib
import json
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scalerl.weights.base import NamedTensors, ReceivedWeights, named_items

if TYPE_CHECKING:
    import torch


def to_safetensors(tensors: NamedTensors) -> bytearray:
    """One safetensors blob of the tensors (byte for byte what `safetensors.torch.save` writes), in a new buffer.

    Tied parameters (a chat model's lm_head sharing the embedding) are written once, under the first name, as
    transformers' save_pretrained does; the receiver ties them again when it loads."""
    layout = SafetensorsLayout.of(tensors)
    out = bytearray(layout.total_bytes)
    layout.write_into(out)
    return out


@dataclass(frozen=True)
class SafetensorsLayout:
    """Where each tensor goes in a safetensors blob: the header, then the data in the safetensors library's order
    (by dtype, the widest first, then by name), so every tensor is aligned to its element size."""

    header: bytes
    """The 8-byte length and the JSON header, padded with spaces to a multiple of 8 bytes."""
    tensors: tuple[tuple[int, "torch.Tensor"], ...]
    """(offset in the blob, tensor) in file order; the tensors are still where they were (CPU or GPU)."""
    total_bytes: int

    @classmethod
    def of(cls, tensors: NamedTensors) -> "SafetensorsLayout":
        items = sorted(untied_items(tensors), key=lambda item: (-_FILE_ORDER.index(_CODES[item[1].dtype]), item[0]))
        meta, offset = {}, 0
        for name, t in items:
            n = t.numel() * t.element_size()
            meta[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
            offset += n
        raw = json.dumps(meta, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        header = len(raw).to_bytes(8, "little") + raw
        placed = tuple((len(header) + meta[name]["data_offsets"][0], t) for name, t in items)
        return cls(header, placed, len(header) + offset)

    def write_into(self, buffer) -> None:
        """Fill `buffer` (any writable buffer of `total_bytes`; page-locked host memory makes the copies from a
        GPU direct DMA): one copy per tensor, device to host where the tensor is on a GPU, one wait at the end."""
        import torch

        out = torch.frombuffer(buffer, dtype=torch.uint8, count=self.total_bytes) if not isinstance(
            buffer, torch.Tensor) else buffer[:self.total_bytes]
        out[:len(self.header)] = torch.frombuffer(bytearray(self.header), dtype=torch.uint8)
        on_gpu = False
        for at, t in self.tensors:
            n = t.numel() * t.element_size()
            if n:
                out[at:at + n].copy_(t.contiguous().view(-1).view(torch.uint8), non_blocking=t.is_cuda)
                on_gpu |= t.is_cuda
        if on_gpu:
            torch.cuda.synchronize()


class StagingBuffers:
    """Host buffers that versions are encoded into, reused from publish to publish: page-locked when the weights
    are on a GPU (the copy is then a DMA at the link's speed; into fresh pageable memory it is ~50x slower, see
    docs/benchmarks/weights.md), and already mapped (no page faults).

    A buffer is leased for as long as its version is being sent (`encoded` is a context manager), and the one
    holding `keep` (the previous version, the base of the next delta) is not written either: the learner's
    training loop and its validation thread (which re-publishes pinned versions) may publish at the same time, each
    into its own buffer. `count` buffers rotate; more are made only while that many are in use."""

    def __init__(self, count: int = 2):
        self._buffers: list = [None] * count
        self._leased: set[int] = set()
        self._next = 0
        self._lock = threading.Lock()

    @contextmanager
    def encoded(self, tensors: NamedTensors, keep: memoryview | bytes | None = None) -> Iterator[memoryview]:
        """The version's safetensors bytes, a view of a buffer nobody else writes until the block ends."""
        blob, release = self.lease(tensors, keep)
        try:
            yield blob
        finally:
            release()

    def lease(self, tensors: NamedTensors, keep: memoryview | bytes | None = None
              ) -> tuple[memoryview, Callable[[], None]]:
        """The version's safetensors bytes, a view of a buffer nobody else writes until `release()` is called."""
        import torch

        layout = SafetensorsLayout.of(tensors)
        pin = any(t.is_cuda for _, t in layout.tensors)
        with self._lock:
            i = self._free_index(keep)
            buf = self._buffers[i]
            if buf is None or buf.numel() < layout.total_bytes or (pin and not buf.is_pinned()):
                buf = self._buffers[i] = None  # the old one is freed first
                buf = self._buffers[i] = torch.empty(layout.total_bytes, dtype=torch.uint8, pin_memory=pin)
            self._leased.add(i)

        def release() -> None:
            with self._lock:
                self._leased.discard(i)

        try:
            layout.write_into(buf)
        except BaseException:
            release()
            raise
        return memoryview(buf.numpy())[:layout.total_bytes], release

    def _free_index(self, keep) -> int:
        n = len(self._buffers)
        for _ in range(n):
            i, self._next = self._next, (self._next + 1) % n
            buf = self._buffers[i]
            if i not in self._leased and (buf is None or not _holds(buf, keep)):
                return i
        self._buffers.append(None)  # every buffer is being sent or is the delta's base
        return n


def _holds(buf: "torch.Tensor", view: memoryview | bytes | None) -> bool:
    if view is None or not len(view):
        return False
    import numpy as np

    start = np.frombuffer(view, dtype=np.uint8).ctypes.data
    return buf.data_ptr() <= start < buf.data_ptr() + buf.numel()


def untied_items(tensors: NamedTensors) -> Iterator[tuple[str, "torch.Tensor"]]:
    """(name, detached tensor where it is), skipping every later name of a tensor already yielded (the same
    storage, offset, shape, strides and dtype). Other views of one storage (a slice, a reshape) are all kept: each
    is copied into the blob on its own."""
    seen_views: set[tuple] = set()
    for name, t in named_items(tensors):
        t = t.detach()
        if t.device.type == "meta":
            raise ValueError(f"{name}: a meta tensor has no data to send")
        if t.numel():
            view = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()),
                    t.dtype)
            if view in seen_views:
                continue
            seen_views.add(view)
        yield name, t


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
           "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


class _Codes(dict):
    """torch dtype -> safetensors dtype code, built on first use (torch is imported lazily here)."""

    def __missing__(self, dtype):
        import torch

        self.update({getattr(torch, name): code for code, name in _DTYPES.items()})
        if dtype not in self:
            raise ValueError(f"safetensors has no dtype for {dtype}")
        return self[dtype]


_CODES = _Codes()
_FILE_ORDER = ("BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64",
               "U64")
"""The safetensors library's dtype order; a file lists the last first (so 8-byte elements come first)."""


def tensors_of(blob: memoryview) -> Iterator[tuple[str, "torch.Tensor"]]:
    """The named tensors of a safetensors blob held in a buffer, as views of it (no copy; they keep the buffer
    alive). safetensors' own `load` takes `bytes` only, which would cost a copy of the whole version."""
    import torch

    if len(blob) < 8:
        raise ValueError("not a safetensors blob: shorter than its header length")
    n = int.from_bytes(blob[:8], "little")
    if 8 + n > len(blob):
        raise ValueError("not a safetensors blob: header past the end")
    header = json.loads(bytes(blob[8:8 + n]))
    header.pop("__metadata__", None)
    tensors = []
    # built in full inside the filter (views cost nothing): a generator would hold the process-wide filter across
    # its yields. Read-only view: the tensors are only read (loaded into the engine).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        for name, meta in header.items():
            dtype = getattr(torch, _DTYPES[meta["dtype"]])
            start, end = meta["data_offsets"]
            count = (end - start) // dtype.itemsize
            if not count:
                tensors.append((name, torch.empty(meta["shape"], dtype=dtype)))
                continue
            flat = torch.frombuffer(blob, dtype=dtype, count=count, offset=8 + n + start)
            tensors.append((name, flat.view(meta["shape"])))
    return iter(tensors)


@dataclass(frozen=True)
class SafetensorsBlob(ReceivedWeights):
    """A version that arrived as safetensors bytes (the gRPC transport verified each chunk as it arrived)."""

    blob: bytes | memoryview
    """The bytes, or a view of the transport's receive buffer (the TCP data plane: no copy)."""
    sha256: str = ""
    """Optional end-to-end sha256 (the filesystem transport's released fetch); `verify` checks it when set."""

    def verify(self) -> None:
        if self.sha256 and hashlib.sha256(self.blob).hexdigest() != self.sha256:
            raise ValueError(f"weights v{self.version}: checksum mismatch")

    def named_tensors(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        if not isinstance(self.blob, bytes):
            return tensors_of(self.blob)
        from safetensors.torch import load

        return iter(load(self.blob).items())


@dataclass(frozen=True)
class SafetensorsFile(ReceivedWeights):
    """A version as a safetensors file on a volume the generator's workers can read."""

    path: str

    def named_tensors(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        from safetensors.torch import load_file

        return iter(load_file(self.path).items())

    def for_workers(self) -> str:
        return self.path
