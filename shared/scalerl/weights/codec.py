"""Named tensors <-> safetensors bytes: the wire format of the gRPC and filesystem transports."""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scalerl.weights.base import NamedTensors, ReceivedWeights, named_items

if TYPE_CHECKING:
    import torch


def to_safetensors(tensors: NamedTensors) -> bytes:
    """One safetensors blob of CPU, contiguous copies (detached from autograd).

    Tied parameters (a chat model's lm_head sharing the embedding) are written once, under the first name, as
    transformers' save_pretrained does: safetensors refuses tensors that share memory, and the receiver ties them
    again when it loads."""
    from safetensors.torch import save

    return save(dict(untied_items(tensors)))


def untied_items(tensors: NamedTensors) -> Iterator[tuple[str, "torch.Tensor"]]:
    """(name, detached contiguous CPU tensor), skipping every later name of a tensor already yielded; another view
    of a storage already yielded (a slice, a reshape) is copied, since safetensors refuses shared memory."""
    seen_views: set[tuple] = set()
    seen_storages: set[int] = set()
    for name, t in named_items(tensors):
        t = t.detach()
        if t.device.type == "meta" or not t.numel():
            yield name, t.contiguous().cpu()
            continue
        storage = t.untyped_storage().data_ptr()
        view = (storage, t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if view in seen_views:
            continue
        seen_views.add(view)
        out = t.contiguous().cpu()
        if storage in seen_storages and out.untyped_storage().data_ptr() == storage:
            out = out.clone()
        seen_storages.add(storage)
        yield name, out


_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
           "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
           "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}


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
