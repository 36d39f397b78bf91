"""One in-flight weight update through each transport, as the learner and a generator use them: the learner side
publishes named tensors, the generator side subscribes (the worker's loop: `transport.subscribe` ->
`engine.update_weights(received)`) while a real vLLM engine (tiny model, CPU) is mid-generation. Each transport
must land the new weights mid-sequence and bit-exact (the engine's parameter checksum)."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from scalerl.ports import unused_port
from scalerl_generator.testing import LoopThread

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

pytestmark = pytest.mark.e2e

PROMPT = "12+7="


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from safetensors.torch import load_file

    from scalerl.models import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    paths = build_tiny_model(root / "m0", seed=0, sft_steps=10), build_tiny_model(root / "m1", seed=1, sft_steps=5)
    states = tuple({k: v for f in sorted(p.glob("*.safetensors")) for k, v in load_file(f).items()} for p in paths)
    return paths, states


@pytest.fixture(scope="module")
def engine(models):
    from scalerl_generator.engine import GenerationEngine

    loop = LoopThread()
    eng = GenerationEngine(str(models[0][0]), seed=0, max_model_len=128, block_size=32)
    loop.run(eng.start(), timeout=600)
    # reference checksums of each model as the engine holds it (vLLM fuses and pads some tensors), loaded directly
    states = models[1]
    reference = []
    for i in (1, 0):
        loop.run(eng.update_weights(states[i], eng.current_version + 1, kv_cache="recompute"))
        reference.insert(0, loop.run(eng.collective_rpc("scalerl_weights_checksum"))[0])
    assert reference[0] != reference[1]
    eng.reference_checksums = reference
    yield eng, loop
    loop.run(eng.shutdown(), timeout=120)
    loop.close()


@pytest.fixture
def hub():
    from scalerl.serving import GRPC_OPTIONS, ErrorInterceptor
    from scalerl_weight_broadcast.service import WeightBroadcastService, add_to_server

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=GRPC_OPTIONS,
                         interceptors=[ErrorInterceptor()])
    service = WeightBroadcastService(poll_s=0.1)
    add_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    data = service.serve_data("127.0.0.1", 0)
    yield f"127.0.0.1:{port}"
    data.stop()
    server.stop(0).wait()


def transport_config(kind: str, request, tmp_path: Path) -> dict:
    if kind.startswith("grpc"):  # grpc: the TCP data plane (the default); grpc-streams: chunks over gRPC too
        return {"type": "grpc", "addr": request.getfixturevalue("hub"), "relay_host": "127.0.0.1",
                "data_plane": "grpc" if kind == "grpc-streams" else "tcp"}
    if kind == "torch_distributed":
        return {"type": "torch_distributed", "addr": f"127.0.0.1:{unused_port()}", "world_size": 2, "timeout_s": 120}
    return {"type": "filesystem", "root": str(tmp_path / "weights"), "poll_s": 0.05}


def learner_process(config: dict, job: str, version: int, path: str, ready, go, done) -> None:
    """A learner in its own process (a process group needs one rank per process): publishes on `go`."""
    from safetensors.torch import load_file

    from scalerl.weights import make_transport

    transport = make_transport(config)
    transport._group(publisher=True)  # the group forms now (with the generator), not at the first publish
    ready.set()
    go.wait(120)
    transport.publish(job, version, load_file(path))
    transport.close()
    done.set()


class LearnerProcess:
    """`publish` through a transport living in another process."""

    def __init__(self, config: dict, tmp_path: Path):
        import multiprocessing as mp

        self.config, self.tmp_path = config, tmp_path
        self.ctx = mp.get_context("spawn")
        self.ready, self.go, self.done = self.ctx.Event(), self.ctx.Event(), self.ctx.Event()
        self.proc = None

    def start(self, job: str, version: int, state: dict) -> None:
        from safetensors.torch import save_file

        path = self.tmp_path / "target.safetensors"
        save_file(state, str(path))
        self.proc = self.ctx.Process(target=learner_process, args=(self.config, job, version, str(path), self.ready,
                                                                   self.go, self.done), daemon=True)
        self.proc.start()

    def publish(self, job: str, version: int, state: dict) -> None:
        self.go.set()
        assert self.done.wait(120), "the learner process did not publish"

    def close(self) -> None:
        if self.proc is not None:
            self.proc.join(30)


@pytest.mark.parametrize("kind", ["grpc", "grpc-streams", "filesystem", "torch_distributed"])
def test_an_in_flight_update_through_the_transport(kind, engine, models, request, tmp_path):
    from scalerl.weights import make_transport

    eng, loop = engine
    _, states = models
    config = transport_config(kind, request, tmp_path)
    job = f"e2e-{uuid.uuid4().hex[:6]}"
    old = eng.current_version
    new = old + 1
    # the other model than the engine holds now: a real change of weights
    holds = eng.reference_checksums.index(loop.run(eng.collective_rpc("scalerl_weights_checksum"))[0])
    target, expected = states[1 - holds], eng.reference_checksums[1 - holds]
    if kind == "torch_distributed":
        learner = LearnerProcess(config, tmp_path)
        learner.start(job, new, target)  # rank 0; this process (the generator) joins as rank 1
    else:
        learner = make_transport(config)
    generator = make_transport(config)
    stop = threading.Event()
    applied: list[float] = []

    def subscribe():  # the generator worker's subscription loop
        for received in generator.subscribe(job, old, stop):
            applied.append(loop.run(eng.update_weights(received, received.version, kv_cache="keep")))
            return

    thread = threading.Thread(target=subscribe, daemon=True)
    thread.start()
    if kind == "torch_distributed":
        assert learner.ready.wait(120), "the process group did not form"
    prompt = eng.tokenizer(PROMPT)["input_ids"]

    async def generate_while_publishing():
        started = asyncio.Event()
        progress: dict[int, int] = {}

        def on_tokens(i: int, k: int) -> None:
            progress[i] = k
            if len(progress) == 4 and min(progress.values()) >= 5:
                started.set()

        task = asyncio.ensure_future(eng.generate(prompt, 4, max_tokens=100, ignore_eos=True, sample_seed=3,
                                                  on_tokens=on_tokens))
        await asyncio.wait_for(started.wait(), 60)
        await asyncio.to_thread(learner.publish, job, new, target)  # the learner's call
        return await task

    try:
        completions = loop.run(generate_while_publishing(), timeout=120)
        thread.join(timeout=60)
        assert applied, "the generator never applied the update"
        assert eng.current_version == new
        switched = [c for c in completions if [v for v, _, _ in c.versions] == [old, new]]
        assert switched, [c.versions for c in completions]  # landed mid-sequence, nothing dropped
        assert all(len(c.token_ids) == 100 for c in completions)
        got = loop.run(eng.collective_rpc("scalerl_weights_checksum"))[0]
        assert got == expected  # bit-exact: the same float64 sum as the model loaded directly
    finally:
        stop.set()
        thread.join(timeout=10)
        learner.close()
        generator.close()
