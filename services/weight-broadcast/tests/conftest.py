"""`data_plane`: a test module that uses it (`pytestmark = pytest.mark.usefixtures("data_plane")`) runs every test
on both data planes of the grpc transport: the raw TCP one (the default) and gRPC streams."""

import pytest

from scalerl.weights.grpc import GrpcStreamTransport


@pytest.fixture(params=["tcp", "grpc"])
def data_plane(request, monkeypatch):
    monkeypatch.setitem(GrpcStreamTransport.__init__.__kwdefaults__, "data_plane", request.param)
    return request.param
