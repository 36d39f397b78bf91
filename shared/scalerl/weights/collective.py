"""Weights broadcast over a torch.distributed process group: the learner is rank 0, each generator takes the next
free rank from the group's TCPStore. One code path for both backends: gloo on CPU, NCCL when CUDA is there
(then the tensors go GPU to GPU and stay on the generator's device).

A version is two broadcasts: a header (version, job id, names, dtypes, shapes, byte size) and one flat byte
buffer holding every tensor. The group is stateless (no default process group), so it coexists with vLLM's own.
Every rank takes part in every broadcast, so each generator receives every version (a receiving thread keeps
only the newest for a slow consumer). There is no store: `fetch` of a pinned version is refused.
"""

from __future__ import annotations

import datetime
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from scalerl import errors
from scalerl.weights.base import NamedTensors, ReceivedWeights, StagedVersion, WeightTransport, named_items

if TYPE_CHECKING:
    import torch

    from scalerl.weights.base import TorchDistributedWeightTransportConfig

_END = -2
"""Header version that ends every subscription (the publisher closed)."""


@dataclass(frozen=True)
class BroadcastTensors(ReceivedWeights):
    """A version received over the process group: views into one flat buffer (on the group's device)."""

    tensors: dict = field(repr=False)

    def named_tensors(self) -> Iterator[tuple[str, "torch.Tensor"]]:
        return iter(self.tensors.items())

    def for_workers(self) -> dict:
        return self.tensors


class TorchDistributedTransport(WeightTransport):
    sends_in_background = False
    """Its staged version is a flat copy on the learner's GPU, which would stay allocated through the next step's
    peak memory; and NCCL may deadlock when a second communicator runs collectives from another thread beside
    FSDP's. So the learner sends before it trains on."""

    def __init__(self, addr: str, world_size: int, *, backend: str = "auto", timeout_s: float = 300.0):
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise errors.InvalidArgument(f"{addr!r} is not host:port", field="weight_transport.addr")
        self.host, self.port = host, int(port)
        self.world_size = world_size
        self.backend = backend
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._pg = None
        self.rank = -1
        self._published = -1
        self._lock = threading.Lock()
        self._sending = threading.Lock()

    @classmethod
    def from_config(cls, config: "TorchDistributedWeightTransportConfig") -> "TorchDistributedTransport":
        return cls(config.addr, config.world_size, backend=config.backend, timeout_s=config.timeout_s)

    # ---- the group -------------------------------------------------------------------------------------------
    @property
    def device(self) -> "torch.device":
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self._nccl() else torch.device("cpu")

    def _nccl(self) -> bool:
        import torch

        return self.backend == "nccl" or (self.backend == "auto" and torch.cuda.is_available())

    def _group(self, publisher: bool):
        with self._lock:
            if self._pg is None:
                import torch.distributed as dist

                store = dist.TCPStore(self.host, self.port, is_master=publisher, timeout=self.timeout,
                                      wait_for_workers=False)
                self.rank = 0 if publisher else int(store.add("scalerl_weights_rank", 1))
                if self.rank >= self.world_size:
                    raise errors.FailedPrecondition(f"rank {self.rank} is past world_size {self.world_size}",
                                                    field="weight_transport.world_size")
                group = dist.ProcessGroupNCCL if self._nccl() else dist.ProcessGroupGloo
                self._pg = group(store, self.rank, self.world_size, self.timeout)
                self._store = store
            return self._pg

    def _broadcast(self, tensor: "torch.Tensor", stop: threading.Event | None = None) -> bool:
        """Rank 0's tensor into every rank's; False when `stop` was set first (the receive is abandoned)."""
        import torch.distributed as dist

        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        work = self._pg.broadcast([tensor], opts)
        if stop is not None:
            while not work.is_completed():
                if stop.wait(0.05):
                    return False
        work.wait()
        return True

    # ---- learner side ----------------------------------------------------------------------------------------
    def stage(self, job_id: str, version: int, tensors: NamedTensors, pinned: bool = False) -> StagedVersion:
        import torch

        self._group(publisher=True)
        items = [(name, t.detach().contiguous()) for name, t in named_items(tensors)]
        meta = json.dumps({"job_id": job_id, "tensors": [[n, str(t.dtype).removeprefix("torch."), list(t.shape)]
                                                         for n, t in items]}).encode()
        flat = torch.cat([t.to(self.device).view(-1).view(torch.uint8) for _, t in items]) if items else \
            torch.empty(0, dtype=torch.uint8, device=self.device)
        if flat.is_cuda:  # the send may run on another thread: the copy is finished before anyone changes a tensor
            torch.cuda.current_stream().synchronize()
        return StagedVersion(lambda: self._send(version, meta, flat))

    def _send(self, version: int, meta: bytes, flat: "torch.Tensor") -> None:
        import torch

        with self._sending:  # one version's three broadcasts at a time, whichever thread sends
            self._send_header(version, len(meta), flat.numel())
            self._broadcast(torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(self.device))
            self._broadcast(flat)
            self._published = version

    def _send_header(self, version: int, meta_bytes: int, flat_bytes: int) -> None:
        import torch

        self._broadcast(torch.tensor([version, meta_bytes, flat_bytes], dtype=torch.int64, device=self.device))

    def close(self) -> None:
        if self._pg is not None and self.rank == 0:
            try:
                with self._sending:
                    self._send_header(_END, 0, 0)
            except Exception:  # a generator already gone: nothing to tell it
                pass
        self._pg = None

    # ---- generator side --------------------------------------------------------------------------------------
    def subscribe(self, job_id: str, have_version: int, stop: threading.Event) -> Iterator[BroadcastTensors]:
        latest: list[BroadcastTensors | None] = [None]
        arrived = threading.Condition()
        ended = threading.Event()

        def receive() -> None:
            try:
                while not stop.is_set():
                    got = self._receive(stop)
                    if got is None:
                        return
                    with arrived:
                        latest[0] = got
                        arrived.notify_all()
            finally:
                ended.set()
                with arrived:
                    arrived.notify_all()

        self._group(publisher=False)
        threading.Thread(target=receive, daemon=True, name="weights-broadcast-receive").start()
        while not stop.is_set():
            with arrived:
                arrived.wait_for(lambda: (latest[0] is not None and latest[0].version > have_version)
                                 or ended.is_set() or stop.is_set(), timeout=0.2)
                got = latest[0]
            if got is not None and got.version > have_version and got.job_id == job_id:
                have_version = got.version
                yield got
            elif ended.is_set():
                return

    def _receive(self, stop: threading.Event) -> BroadcastTensors | None:
        import torch

        header = torch.zeros(3, dtype=torch.int64, device=self.device)
        if not self._broadcast(header, stop):
            return None
        version, meta_bytes, flat_bytes = (int(x) for x in header.tolist())
        if version == _END:
            return None
        meta_t = torch.empty(meta_bytes, dtype=torch.uint8, device=self.device)
        flat = torch.empty(flat_bytes, dtype=torch.uint8, device=self.device)
        self._broadcast(meta_t)
        self._broadcast(flat)
        meta = json.loads(bytes(meta_t.cpu().numpy()))
        self._published = version
        tensors, offset = {}, 0
        for name, dtype, shape in meta["tensors"]:
            dt = getattr(torch, dtype)
            n = dt.itemsize * (int(torch.tensor(shape).prod()) if shape else 1)
            tensors[name] = flat[offset:offset + n].view(dt).view(shape)
            offset += n
        return BroadcastTensors(meta["job_id"], version, tensors)

    def fetch(self, job_id: str, version: int, release: bool = False) -> ReceivedWeights:
        raise errors.FailedPrecondition("the torch_distributed transport keeps no versions to fetch (an evaluator "
                                        "needs the grpc or filesystem transport)", field="weight_transport.type",
                                        job_id=job_id)

    def latest_version(self, job_id: str) -> int:
        return self._published
