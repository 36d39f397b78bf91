"""`verify_threads`: a test module that uses it runs every test both with each arriving chunk checked on the thread
that receives it (a box with few cores) and on the verify threads (a node with many)."""

import pytest

from scalerl.weights import chunked


@pytest.fixture(params=[0, 4], ids=["verify-inline", "verify-threads"])
def verify_threads(request, monkeypatch):
    monkeypatch.setattr(chunked, "VERIFY_THREADS", request.param)
    return request.param
