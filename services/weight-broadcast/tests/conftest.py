"""`data_plane`: a test module that uses it (`pytestmark = pytest.mark.usefixtures("data_plane")`) runs every test
on both data planes of the grpc transport: the raw TCP one (the default) and gRPC streams. `planes_and_checks`:
the same, and on the TCP plane both with each arriving chunk checked on the thread that receives it (a box with
few cores) and on the verify threads (a node with many; the gRPC plane always checks on the receiving thread)."""

import pytest

from scalerl.weights import chunked
from scalerl.weights.grpc import GrpcStreamTransport


@pytest.fixture(params=["tcp", "grpc"])
def data_plane(request, monkeypatch):
    monkeypatch.setitem(GrpcStreamTransport.__init__.__kwdefaults__, "data_plane", request.param)
    return request.param


@pytest.fixture(params=[("tcp", 0), ("tcp", 4), ("grpc", 0)], ids=["tcp", "tcp-verify-threads", "grpc"])
def planes_and_checks(request, monkeypatch):
    plane, verify_threads = request.param
    monkeypatch.setitem(GrpcStreamTransport.__init__.__kwdefaults__, "data_plane", plane)
    monkeypatch.setattr(chunked, "VERIFY_THREADS", verify_threads)
    return plane
