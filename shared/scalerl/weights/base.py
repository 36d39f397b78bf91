"""How weights move from the learner to generators, as named tensors.

The learner publishes its state dict's named tensors; the generator receives named tensors that vLLM's workers
load. How they travel is the transport's own business (the gRPC transport streams safetensors bytes through the
weight-broadcast service; a collective transport would broadcast the tensors themselves), so one can be swapped
for another by config without touching the learner or the generator loop.

Light on purpose: no torch and no transport module is imported here, so the api can import the config.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from scalerl.errors import InvalidArgument

if TYPE_CHECKING:
    import torch

NamedTensors = Union[Mapping[str, "torch.Tensor"], Iterable[tuple[str, "torch.Tensor"]]]
"""A state dict, or (name, tensor) pairs in HF checkpoint names."""

# gRPC Python moves 64 MiB ~7x faster as 256 KiB messages than as 4 MiB ones (bench/weights_bench.py).
CHUNK_BYTES = 256 * 1024
"""Default size of one weight chunk on the gRPC wire (publisher and weight-broadcast service)."""


def named_items(tensors: NamedTensors) -> Iterator[tuple[str, "torch.Tensor"]]:
    return iter(tensors.items()) if isinstance(tensors, Mapping) else iter(tensors)


@dataclass(frozen=True)
class ReceivedWeights(ABC):
    """One version as the generator side receives it."""

    job_id: str
    version: int

    @abstractmethod
    def named_tensors(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        """The version's (name, tensor) pairs, on CPU."""

    def for_workers(self) -> "dict[str, torch.Tensor] | str":
        """What vLLM's workers load: the named tensors, or a safetensors file path when the workers can read
        the file themselves (nothing then crosses the executor)."""
        return dict(self.named_tensors())


class WeightTransport(ABC):
    @abstractmethod
    def publish(self, job_id: str, version: int, tensors: NamedTensors, pinned: bool = False) -> None:
        """Learner side: publish one version once (fan-out is the transport's job). A pinned version stays
        fetchable until fetched with release=True (validation of exactly that version)."""

    @abstractmethod
    def subscribe(self, job_id: str, have_version: int, stop: threading.Event) -> Iterator[ReceivedWeights]:
        """Generator side: yields the latest version newer than `have_version`, then each later one, until
        `stop` is set."""

    @abstractmethod
    def fetch(self, job_id: str, version: int, release: bool = False) -> ReceivedWeights:
        """One pinned version (validation); scalerl.errors.NotFound-like failure when it is gone."""

    @abstractmethod
    def latest_version(self, job_id: str) -> int:
        """The newest published version of the job, -1 when none is."""

    def close(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------- config
class GrpcWeightTransportConfig(BaseModel):
    """Safetensors bytes streamed through the weight-broadcast service, which fans them out."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["grpc"] = "grpc"
    addr: str = ""
    """host:port of the weight-broadcast service; empty means the settings' `weight_broadcast_addr`."""
    chunk_bytes: int = Field(default=CHUNK_BYTES, ge=1024, le=64 << 20)
    """Bytes per WeightChunk message the publisher sends."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Deadline of one Publish or Fetch call."""


class FilesystemWeightTransportConfig(BaseModel):
    """One safetensors file per version on a volume every learner and generator mounts (no service in between;
    vLLM's workers read the file themselves)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["filesystem"] = "filesystem"
    root: str = Field(min_length=1)
    """Shared directory; versions land in `root/<job_id>/v<version>.safetensors`."""
    keep_versions: int = Field(default=4, ge=1)
    """Newest versions kept per job (pinned versions are kept until released)."""
    poll_s: float = Field(default=0.5, gt=0)
    """How often a subscriber looks for a newer version."""


WeightTransportConfig = Annotated[Union[GrpcWeightTransportConfig, FilesystemWeightTransportConfig],
                                  Field(discriminator="type")]
"""The transport a learner publishes with and a generator receives with (they must agree)."""

_CONFIG = TypeAdapter(WeightTransportConfig)
TRANSPORT_TYPES = ("grpc", "filesystem")
"""The `type` of every WeightTransportConfig variant (the registry in `scalerl.weights` has one entry each)."""


def parse_transport_config(raw: Any) -> GrpcWeightTransportConfig | FilesystemWeightTransportConfig:
    """A config object, or its dict form; an unknown or missing `type` is InvalidArgument naming the field."""
    try:
        return _CONFIG.validate_python(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"] if p not in TRANSPORT_TYPES)
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            where = "type"
        raise InvalidArgument(f"{first['msg']} (known: {', '.join(TRANSPORT_TYPES)})",
                              field=f"weight_transport.{where}" if where else "weight_transport") from err
