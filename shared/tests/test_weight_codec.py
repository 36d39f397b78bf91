"""The safetensors encoder of the gRPC, TCP and filesystem transports: byte for byte what the safetensors library
writes, and the staging buffers a learner encodes every version into (reused, never the delta's base)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from scalerl.weights.codec import StagingBuffers, to_safetensors


def mixed_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    return {
        "layers.1.w": torch.randn(5, 3, generator=g).to(torch.bfloat16),
        "layers.0.w": torch.randn(4, 4, generator=g),
        "transposed": base.t(),  # not contiguous
        "slice": base[2:4],  # another view of the same storage
        "mask": torch.tensor([True, False, True]),
        "ids": torch.arange(7, dtype=torch.int64),
        "half": torch.randn(3, generator=g).to(torch.float16),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
        "bytes": torch.arange(5, dtype=torch.uint8),
        "signed": torch.arange(-3, 3, dtype=torch.int8),
        "short": torch.arange(4, dtype=torch.int16),
        "int": torch.arange(3, dtype=torch.int32),
        "fp8": torch.randn(4, generator=g).to(torch.float8_e4m3fn),
        "fp8_wide": torch.randn(4, generator=g).to(torch.float8_e5m2),
    }


def test_the_blob_is_what_the_safetensors_library_writes():
    tensors = mixed_tensors()
    expected = save({k: v.contiguous() for k, v in tensors.items()})
    assert bytes(to_safetensors(tensors)) == expected
    got = load(bytes(to_safetensors(tensors)))
    assert set(got) == set(tensors) and all(torch.equal(got[k], v) for k, v in tensors.items())


def test_a_meta_tensor_is_refused_by_name():
    with pytest.raises(ValueError, match="w: a meta tensor"):
        to_safetensors({"w": torch.empty(2, device="meta")})


def address(view: memoryview) -> int:
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def encode(staging: StagingBuffers, tensors, keep=None) -> memoryview:
    """One publish (the view is read after its lease ended: safe here, where nothing else encodes meanwhile)."""
    with staging.encoded(tensors, keep=keep) as view:
        return view


def test_staging_reuses_its_buffers_and_never_writes_the_one_kept():
    staging = StagingBuffers(count=2)
    first = encode(staging, mixed_tensors())
    assert bytes(first) == save({k: v.contiguous() for k, v in mixed_tensors().items()})
    second = encode(staging, {"w": torch.ones(3)}, keep=first)
    third = encode(staging, {"w": torch.full((3,), 2.0)}, keep=second)
    assert address(third) == address(first)  # the same memory again: no new allocation per version
    assert load(bytes(second))["w"].tolist() == [1.0, 1.0, 1.0]

    # a publish that failed leaves the older version as the base: the rotation steps over its buffer
    kept = bytes(third)
    fourth = encode(staging, {"w": torch.full((3,), 4.0)}, keep=third)
    fifth = encode(staging, {"w": torch.full((3,), 5.0)}, keep=third)
    assert address(fifth) == address(fourth) != address(third)
    assert bytes(third) == kept


def test_a_version_being_sent_is_not_overwritten_by_another_publish():
    """The training loop publishes while the validation thread re-publishes a pinned version: each is written
    into its own buffer, and a buffer comes back into the rotation only when its publish ended."""
    staging = StagingBuffers(count=2)
    with staging.encoded({"w": torch.full((4,), 1.0)}) as training:
        sent = bytes(training)
        with staging.encoded({"w": torch.full((4,), 2.0)}, keep=None) as validation:
            with staging.encoded({"w": torch.full((4,), 3.0)}, keep=validation) as third:
                assert len({address(training), address(validation), address(third)}) == 3
                assert load(bytes(third))["w"].tolist() == [3.0] * 4
            assert load(bytes(validation))["w"].tolist() == [2.0] * 4
        assert bytes(training) == sent
    again = encode(staging, {"w": torch.full((4,), 5.0)})
    assert address(again) in {address(training), address(validation), address(third)}  # no fourth buffer


def test_staging_grows_for_a_larger_version():
    staging = StagingBuffers(count=1)
    small = bytes(encode(staging, {"w": torch.ones(2)}))
    big = encode(staging, {"w": torch.arange(10_000.0)})
    assert load(bytes(big))["w"].equal(torch.arange(10_000.0))
    assert load(small)["w"].tolist() == [1.0, 1.0]
    assert len(encode(staging, {"w": torch.ones(2)})) == len(small)  # the view is the version's length
