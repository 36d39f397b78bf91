"""Named tensors <-> safetensors bytes: the wire format of the gRPC and filesystem transports."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scalerl.weights.base import NamedTensors, ReceivedWeights, named_items

if TYPE_CHECKING:
    import torch


def to_safetensors(tensors: NamedTensors) -> bytes:
    """One safetensors blob of CPU, contiguous copies (detached from autograd)."""
    from safetensors.torch import save

    return save({name: t.detach().contiguous().cpu() for name, t in named_items(tensors)})


@dataclass(frozen=True)
class SafetensorsBlob(ReceivedWeights):
    """A version that arrived as safetensors bytes (checksum verified on arrival by the transport)."""

    blob: bytes
    sha256: str

    def verify(self) -> None:
        if hashlib.sha256(self.blob).hexdigest() != self.sha256:
            raise ValueError(f"weights v{self.version}: checksum mismatch")

    def named_tensors(self) -> Iterator[tuple[str, "torch.Tensor"]]:
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
