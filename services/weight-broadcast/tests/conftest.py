"""`data_plane`: a test module that uses it (`pytestmark = pytest.mark.usefixtures("data_plane")`) runs every test
on both data planes of the grpc transport: the raw TCP one (the default) and gRPC streams. `verify_threads`: every
test both with each chunk checked on the thread that receives it (a box with few cores) and on the verify
threads (a node with many)."""

import pytest

from scalerl.weights import chunked
from scalerl.weights.grpc import GrpcStreamTransport


@pytest.fixture(params=[0, 4], ids=["verify-inline", "verify-threads"])
def verify_threads(request, monkeypatch):
    monkeypatch.setattr(chunked, "VERIFY_THREADS", request.param)
    return request.param


@pytest.fixture(params=["tcp", "grpc"])
def data_plane(request, monkeypatch):
    monkeypatch.setitem(GrpcStreamTransport.__init__.__kwdefaults__, "data_plane", request.param)
    return request.param
