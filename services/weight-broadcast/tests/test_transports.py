"""The tensor-level transport interface: the registry chosen by config, named tensors through the real
weight-broadcast service (bit-exact), and the shared-volume transport."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import typing
import uuid

import pytest
import torch

from scalerl import errors
from scalerl.ports import unused_port
from scalerl.settings import Settings
from scalerl.weights import TRANSPORTS, FilesystemWeightTransportConfig, GrpcWeightTransportConfig, make_transport
from scalerl.weights.base import TRANSPORT_TYPES, WeightTransportConfig
from scalerl.weights.codec import SafetensorsBlob, SafetensorsFile
from scalerl.weights.filesystem import FilesystemTransport
from scalerl.weights.grpc import GrpcStreamTransport

from test_weight_broadcast import Server


def state_dict() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    linear = torch.nn.Linear(8, 6)  # parameters that require grad
    return {
        "model.embed_tokens.weight": torch.randn(11, 8, generator=g),
        "model.layers.0.mlp.weight": linear.weight,
        "model.layers.0.mlp.bias": linear.bias,
        "model.norm.weight": torch.randn(8, generator=g).to(torch.bfloat16),
        "lm_head.weight": torch.randn(8, 11, generator=g).t(),  # not contiguous
        "half": torch.tensor([1.0, float("inf"), -0.0, 6.1e-5], dtype=torch.float16),
        "steps": torch.arange(5, dtype=torch.int64),
    }


def assert_same(got: dict[str, torch.Tensor], sent: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(sent)
    for name, tensor in sent.items():
        expected = tensor.detach()
        assert got[name].dtype == expected.dtype and got[name].shape == expected.shape, name
        # bit-exact: compare the raw bytes, so -0.0 / inf / bf16 rounding all count
        assert got[name].contiguous().view(torch.uint8).equal(expected.contiguous().view(torch.uint8)), name


@pytest.fixture
def job():
    return f"job-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------------- registry
def test_registry_builds_the_configured_transport(tmp_path):
    server = Server()
    try:
        grpc_transport = make_transport(GrpcWeightTransportConfig(addr=server.addr, chunk_bytes=4096))
        assert isinstance(grpc_transport, GrpcStreamTransport) and grpc_transport.chunk_bytes == 4096
        grpc_transport.close()
        as_dict = make_transport({"type": "grpc", "addr": server.addr})
        assert isinstance(as_dict, GrpcStreamTransport)
        as_dict.close()
    finally:
        server.stop()
    fs = make_transport(FilesystemWeightTransportConfig(root=str(tmp_path), keep_versions=2))
    assert isinstance(fs, FilesystemTransport) and fs.root == tmp_path and fs.keep_versions == 2


def test_every_config_variant_has_one_registry_entry():
    variants = typing.get_args(typing.get_args(WeightTransportConfig)[0])
    assert {v.model_fields["type"].default for v in variants} == set(TRANSPORT_TYPES) == set(TRANSPORTS)


@pytest.mark.parametrize("raw,field", [
    ({"type": "carrier-pigeon", "addr": "x:1"}, "weight_transport.type"),
    ({"addr": "x:1"}, "weight_transport.type"),
    ({"type": "grpc", "addr": "x:1", "chunk_bytes": 1}, "weight_transport.chunk_bytes"),
    ({"type": "filesystem"}, "weight_transport.root"),
    ({"type": "grpc", "addr": ""}, "weight_transport.addr"),
    ({"type": "grpc", "addr": "x:1", "relay_fanout": 0}, "weight_transport.relay_fanout"),
    ({"type": "torch_distributed", "addr": "x:1"}, "weight_transport.world_size"),
    ({"type": "torch_distributed", "addr": "x:1", "world_size": 2, "backend": "mpi"}, "weight_transport.backend"),
])
def test_registry_refuses_a_bad_config_naming_the_field(raw, field):
    with pytest.raises(errors.InvalidArgument) as err:
        make_transport(raw)
    assert err.value.field == field
    assert str(err.value).startswith(field)


def test_settings_choose_the_transport(monkeypatch, tmp_path):
    monkeypatch.setenv("SCALERL_WEIGHT_BROADCAST_ADDR", "10.0.0.7:18056")
    assert Settings().weight_transport == GrpcWeightTransportConfig(addr="10.0.0.7:18056")
    monkeypatch.setenv("SCALERL_WEIGHT_TRANSPORT__CHUNK_BYTES", "65536")
    assert Settings().weight_transport == GrpcWeightTransportConfig(addr="10.0.0.7:18056", chunk_bytes=65536)
    monkeypatch.delenv("SCALERL_WEIGHT_TRANSPORT__CHUNK_BYTES")
    monkeypatch.setenv("SCALERL_WEIGHT_TRANSPORT__TYPE", "filesystem")
    monkeypatch.setenv("SCALERL_WEIGHT_TRANSPORT__ROOT", str(tmp_path))
    assert Settings().weight_transport == FilesystemWeightTransportConfig(root=str(tmp_path))
    monkeypatch.setenv("SCALERL_WEIGHT_TRANSPORT__TYPE", "nccl")
    with pytest.raises(ValueError, match="weight_transport"):
        Settings()


def test_base_and_settings_import_without_torch_or_a_transport():
    code = ("import sys, scalerl.settings, scalerl.weights; "
            "bad = [m for m in ('torch', 'safetensors', 'scalerl.weights.grpc', 'scalerl.weights.filesystem', "
            "'scalerl.weights.collective', 'numpy') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------------- gRPC
def test_named_tensors_through_the_grpc_service_are_bit_exact(job):
    server = Server()
    publisher = make_transport(GrpcWeightTransportConfig(addr=server.addr, chunk_bytes=1024))
    receiver = GrpcStreamTransport(server.addr)
    try:
        sent = state_dict()
        publisher.publish(job, 1, sent)
        stop = threading.Event()
        subscription = receiver.subscribe(job, -1, stop)
        got = next(subscription)
        subscription.close()
        assert isinstance(got, SafetensorsBlob) and (got.job_id, got.version) == (job, 1)
        assert_same(dict(got.named_tensors()), sent)
        assert_same(got.for_workers(), sent)

        publisher.publish(job, 2, list(sent.items()), pinned=True)  # (name, tensor) pairs work the same
        assert receiver.latest_version(job) == 2
        assert_same(dict(receiver.fetch(job, 2, release=True).named_tensors()), sent)
    finally:
        publisher.close()
        receiver.close()
        server.stop()


# ---------------------------------------------------------------------------------------------------- filesystem
def test_filesystem_transport_round_trip(tmp_path, job):
    publisher = FilesystemTransport(tmp_path, keep_versions=2, poll_s=0.01)
    receiver = FilesystemTransport(tmp_path, keep_versions=2, poll_s=0.01)
    assert receiver.latest_version(job) == -1
    sent = state_dict()
    publisher.publish(job, 0, sent, pinned=True)
    stop = threading.Event()
    subscription = receiver.subscribe(job, -1, stop)
    got = next(subscription)
    assert isinstance(got, SafetensorsFile) and got.version == 0
    assert got.for_workers() == got.path  # vLLM's workers read the file themselves
    assert_same(dict(got.named_tensors()), sent)

    for v in (1, 2, 3):
        publisher.publish(job, v, {"w": torch.full((2,), float(v))})
    assert next(subscription).version == 3  # missed versions: the latest only
    stop.set()
    assert list(subscription) == []
    assert receiver.latest_version(job) == 3
    assert sorted(p.name for p in (tmp_path / job).glob("*.safetensors")) == [
        "v0.safetensors", "v2.safetensors", "v3.safetensors"]  # v1 pruned, pinned v0 kept
    with pytest.raises(errors.NotFound) as err:
        receiver.fetch(job, 1)
    assert err.value.field == "version"
    released = receiver.fetch(job, 0, release=True)
    assert_same(dict(released.named_tensors()), sent)
    publisher.publish(job, 4, {"w": torch.zeros(2)})
    assert not (tmp_path / job / "v0.safetensors").exists()  # released: pruned by the next publish
    with pytest.raises(errors.InvalidArgument, match="not newer"):
        publisher.publish(job, 4, {"w": torch.zeros(2)})
    with pytest.raises(errors.InvalidArgument):
        publisher.publish("../escape", 1, {"w": torch.zeros(2)})


# ---------------------------------------------------------------------------------------------------- torch.distributed
def test_torch_distributed_broadcasts_bit_exact_versions_over_gloo(job):
    config = {"type": "torch_distributed", "addr": f"127.0.0.1:{unused_port()}", "world_size": 3, "backend": "gloo",
              "timeout_s": 60}
    learner = make_transport(config)
    generators = [make_transport(config) for _ in range(2)]
    stop = threading.Event()
    received: list[list] = [[], []]

    def generator(i: int) -> None:
        for got in generators[i].subscribe(job, -1, stop):
            received[i].append((got.version, dict(got.named_tensors())))

    threads = [threading.Thread(target=generator, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    sent = state_dict()
    try:
        learner.publish(job, 1, sent)
        second = {k: (v.detach() + 1 if v.is_floating_point() else v) for k, v in sent.items()}
        learner.publish(job, 2, second)
        learner.close()  # ends every subscription
        for t in threads:
            t.join(timeout=30)
            assert not t.is_alive()
        assert sorted({r.rank for r in generators}) == [1, 2]
        for got in received:
            assert got[-1][0] == 2  # the newest (a slow consumer may skip one)
            assert_same(got[-1][1], second)
            if len(got) == 2:
                assert_same(got[0][1], sent)
        with pytest.raises(errors.FailedPrecondition):
            generators[0].fetch(job, 1)
    finally:
        stop.set()


def test_tied_parameters_are_written_once_under_the_first_name():
    """A chat model's lm_head shares the embedding (SmolLM2): safetensors refuses shared memory, so the blob
    holds it once, under the embedding's name, as save_pretrained does; vLLM ties it again on load."""
    from scalerl.weights.codec import to_safetensors
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    sent = model.state_dict()
    assert sent["lm_head.weight"].data_ptr() == sent["model.embed_tokens.weight"].data_ptr()
    got = dict(SafetensorsBlob(job_id="j", version=1, blob=to_safetensors(sent)).named_tensors())
    assert "lm_head.weight" not in got and set(got) == set(sent) - {"lm_head.weight"}
    assert_same(got, {k: v for k, v in sent.items() if k != "lm_head.weight"})
    # a slice or a view with another shape of the same storage is not a tie
    base = torch.arange(12.0)
    views = dict(SafetensorsBlob(job_id="j", version=1, blob=to_safetensors(
        {"a": base, "b": base[:6], "c": base.view(3, 4)})).named_tensors())
    assert set(views) == {"a", "b", "c"} and torch.equal(views["b"], base[:6])


# ---------------------------------------------------------------------------------------------------- staging
def change_in_place(tensors: dict[str, torch.Tensor]) -> None:
    """What the learner's next optimizer step does to the tensors it staged."""
    with torch.no_grad():
        for t in tensors.values():
            t.add_(1) if t.is_floating_point() else t.mul_(3)


@pytest.mark.parametrize("kind", ["grpc", "filesystem", "torch_distributed"])
def test_a_staged_version_is_sent_as_it_was_staged_though_its_tensors_changed_after(kind, tmp_path, job):
    """The learner stages a version, trains on (changes its tensors in place) and the version is sent meanwhile by
    another thread: generators get the tensors as they were when staged, bit for bit, on every transport."""
    tensors = {k: v.detach().clone() for k, v in state_dict().items()}
    as_staged = {k: v.clone() for k, v in tensors.items()}
    stop = threading.Event()
    server = None
    received: list = []
    if kind == "grpc":
        server = Server()
        config = {"type": "grpc", "addr": server.addr, "chunk_bytes": 1024}
    elif kind == "filesystem":
        config = {"type": "filesystem", "root": str(tmp_path), "poll_s": 0.01}
    else:
        config = {"type": "torch_distributed", "addr": f"127.0.0.1:{unused_port()}", "world_size": 2,
                  "backend": "gloo", "timeout_s": 60}
    learner, generator = make_transport(config), make_transport(config)
    if kind == "torch_distributed":  # every rank joins the group before the first broadcast
        def receive() -> None:
            for got in generator.subscribe(job, -1, stop):
                received.append(dict(got.named_tensors()))
        threading.Thread(target=receive, daemon=True).start()
    try:
        staged = learner.stage(job, 1, tensors)
        change_in_place(tensors)
        sender = threading.Thread(target=staged.send)
        sender.start()
        sender.join(timeout=60)
        assert not sender.is_alive()
        if kind == "torch_distributed":
            learner.close()
            deadline = time.monotonic() + 30
            while not received and time.monotonic() < deadline:
                time.sleep(0.05)
            got = received[-1]
        else:
            subscription = generator.subscribe(job, -1, stop)
            got = dict(next(subscription).named_tensors())
            subscription.close()
        assert_same(got, as_staged)
        assert not any(t.contiguous().view(torch.uint8).equal(as_staged[k].contiguous().view(torch.uint8))
                       for k, t in tensors.items())  # the tensors did change: the copy is what was sent
    finally:
        stop.set()
        if kind != "torch_distributed":
            learner.close()
        generator.close()
        if server is not None:
            server.stop()
