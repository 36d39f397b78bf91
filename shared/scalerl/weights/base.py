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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from scalerl.errors import InvalidArgument

if TYPE_CHECKING:
    import torch

NamedTensors = Union[Mapping[str, "torch.Tensor"], Iterable[tuple[str, "torch.Tensor"]]]
"""A state dict, or (name, tensor) pairs in HF checkpoint names."""

# gRPC Python moves 64 MiB fastest as 256 KiB-1 MiB messages (several times faster than as 4 MiB ones); fewer
# messages cost less per-message work in Python (bench/weights_bench.py).
CHUNK_BYTES = 1024 * 1024
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


class StagedVersion:
    """One version copied out of the learner's tensors and not sent yet: the learner may change its tensors (train
    the next step) while `send` runs on another thread."""

    def __init__(self, send: Callable[[], None], release: Callable[[], None] | None = None):
        self._send = send
        self._release = release

    def send(self) -> None:
        """Publish the version; what the staging holds (a host buffer) is let go afterwards, also on failure."""
        try:
            self._send()
        finally:
            self.release()

    def release(self) -> None:
        """Let go of the staging without sending (the job ended first); idempotent."""
        release, self._release = self._release, None
        if release is not None:
            release()


class WeightTransport(ABC):
    last_publish_sent_as: Literal["whole", "delta"] = "whole"
    """How the last publish went (the grpc transport sends deltas; the others always whole versions)."""
    sends_in_background: bool = True
    """Whether the learner may send a staged version while it trains the next step
    (`pipeline.publish_in_background`)."""

    def publish(self, job_id: str, version: int, tensors: NamedTensors, pinned: bool = False) -> None:
        """Learner side: publish one version once (fan-out is the transport's job). A pinned version stays
        fetchable until fetched with release=True (validation of exactly that version)."""
        self.stage(job_id, version, tensors, pinned=pinned).send()

    @abstractmethod
    def stage(self, job_id: str, version: int, tensors: NamedTensors, pinned: bool = False) -> StagedVersion:
        """The first half of `publish`: copy the version out of `tensors` into what the transport sends from (a
        host buffer, one flat tensor), so that the caller may change them once this returns. `send` may run on
        any thread; the transport orders concurrent sends itself."""

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
    chunk_bytes: int = Field(default=CHUNK_BYTES, ge=1024, le=64 << 20, multiple_of=8)
    """Bytes per WeightChunk message the publisher sends (the unit of hashing, delta and relay pipelining)."""
    timeout_s: float = Field(default=300.0, gt=0)
    """Deadline of one Publish or Fetch call; a publish is retried within it while the hub is unavailable
    (restarting)."""
    delta: bool | Literal["auto"] = "auto"
    """true: publish only the chunks that changed since the previous version (whole or as 16-bit-word patches)
    when that is smaller; a subscriber without the base gets the whole version. The publisher keeps its last
    version in host memory (one state dict's worth) as the base. false: every version whole. auto: whichever has
    been faster, both timed from publish start to the hub's answer (the other retried every 16 publishes): a
    delta sends a few percent of the bytes, but finding and patching the changed words and hashing every changed
    chunk costs ~1 s of CPU per GB across the learner and each node, so deltas win on links slower than ~10 Gb/s
    and whole versions on fast fabrics (docs/benchmarks/weights.md)."""
    relay: bool = True
    """Subscribers forward chunks to their children in the hub's relay tree (so the hub sends each byte at most
    `relay_fanout` times); off: every subscriber streams from the hub."""
    relay_fanout: int = Field(default=1, ge=1, le=16)
    """Children per node of the relay tree, the hub included. 1, a chain, is the fastest at scale (each node
    sends each byte once; `bench/weights_at_scale.py`); more: shallower, so fewer nodes behind a failed one.
    Read by the weight-broadcast hub."""
    relay_host: str = ""
    """Host peers reach this subscriber's relay at (the pod IP in Kubernetes); empty: this host's address."""
    relay_port: int = Field(default=0, ge=0, le=65535)
    """Port of the subscriber's relay server; 0: any free port."""
    data_plane: Literal["grpc", "tcp"] = "tcp"
    """What carries the chunks (Publish, Subscribe, Fetch): `tcp`, raw sockets (a hop runs near a socket copy,
    chunks land in reused buffers, no copy in Python; `scalerl.weights.tcp`), or `grpc` streams (~0.2-0.3 of a
    socket copy in Python). Join and GetLatest stay on gRPC either way; every subscriber of a job must use the
    same plane (their relays serve only their own)."""
    hub_keep_versions: int = Field(default=2, ge=1, le=64)
    """Newest versions the weight-broadcast hub holds per job besides pinned ones (read by the hub): the latest for
    late joiners and relays, the one before as a delta base. The hub's memory is about (hub_keep_versions + 2) x
    the version size (one arriving, one buffer being reused); it warns when that passes its memory limit."""
    data_port: int = Field(default=0, ge=0, le=65535)
    """Port of the hub's TCP data plane (read by the weight-broadcast hub, which always serves it; clients learn
    it from GetLatest); 0: any free port. Kubernetes needs a fixed one in the hub's Service."""


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


class TorchDistributedWeightTransportConfig(BaseModel):
    """Tensors broadcast over a torch.distributed process group (NCCL on GPU, gloo on CPU; one code path): the
    learner is rank 0 and hosts the group's TCPStore, each generator takes the next free rank. No service in
    between, no stored versions (an evaluator's `fetch` needs grpc or filesystem)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: Literal["torch_distributed"] = "torch_distributed"
    addr: str = Field(min_length=3)
    """host:port of the TCPStore the learner opens (the learner pod's address and a free port)."""
    world_size: int = Field(ge=2)
    """The learner plus every generator that receives weights; every rank joins before the first update."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """auto: NCCL when CUDA is available, else gloo."""
    timeout_s: float = Field(default=300.0, gt=0)
    """How long a rank waits for the others (joining, and each broadcast)."""


WeightTransportConfig = Annotated[Union[GrpcWeightTransportConfig, FilesystemWeightTransportConfig,
                                        TorchDistributedWeightTransportConfig],
                                  Field(discriminator="type")]
"""The transport a learner publishes with and a generator receives with (they must agree)."""

_CONFIG = TypeAdapter(WeightTransportConfig)
TRANSPORT_TYPES = ("grpc", "filesystem", "torch_distributed")
"""The `type` of every WeightTransportConfig variant (the registry in `scalerl.weights` has one entry each)."""


def parse_transport_config(raw: Any) -> (GrpcWeightTransportConfig | FilesystemWeightTransportConfig
                                         | TorchDistributedWeightTransportConfig):
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
