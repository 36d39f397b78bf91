"""The hub as its main builds it: retention from the settings, and a warning before its memory runs out."""

from __future__ import annotations

import logging
import os

from scalerl.settings import Settings
from scalerl.weights.chunked import ChunkedVersion
from scalerl_weight_broadcast.main import build_service
from scalerl_weight_broadcast.service import WeightBroadcastService, memory_limit_bytes


def test_the_hub_keeps_as_many_versions_as_configured_and_serves_the_data_plane():
    settings = Settings(service="weight-broadcast", weight_transport={"type": "grpc", "addr": "127.0.0.1:1",
                                                                      "hub_keep_versions": 3})
    service = build_service(settings)
    try:
        assert service.store.keep_versions == 3
        assert service.data is not None and service.data.port > 0
    finally:
        service.data.stop()


def test_memory_limit_is_read_from_cgroup_v2_then_v1(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    assert memory_limit_bytes([str(v2), str(v1)]) is None  # neither file: unknown
    v1.write_text("9223372036854771712\n")  # v1's "no limit"
    assert memory_limit_bytes([str(v2), str(v1)]) is None
    v1.write_text("34359738368\n")
    assert memory_limit_bytes([str(v2), str(v1)]) == 32 << 30
    v2.write_text("max\n")
    assert memory_limit_bytes([str(v2), str(v1)]) is None  # v2 present and unlimited
    v2.write_text("1073741824\n")
    assert memory_limit_bytes([str(v2), str(v1)]) == 1 << 30


def publish(service: WeightBroadcastService, job: str, version: int, blob: bytes) -> None:
    """A version into the hub's store as its Publish puts it there (both planes end in `published`)."""
    headers = list(ChunkedVersion.from_blob(job, version, blob, 4096).headers())
    incoming = service.store.begin(headers[0][0])
    for header, data in headers:
        incoming.add(None, header, data)
    service.store.complete(incoming)
    service.published(incoming)


def test_a_hub_whose_versions_cannot_fit_its_memory_limit_warns_once_per_job(caplog):
    service = WeightBroadcastService()
    service.memory_limit = 100_000  # (keep 4 + 2) x 20 kB = 120 kB > 90 % of it
    with caplog.at_level(logging.WARNING, logger="scalerl_weight_broadcast.service"):
        publish(service, "big", 1, os.urandom(20_000))
        publish(service, "big", 2, os.urandom(20_000))
        publish(service, "small", 1, os.urandom(1_000))
    warnings = [r.getMessage() for r in caplog.records if "memory" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "6 versions" in warnings[0] and "hubKeepVersions (now 4)" in warnings[0]
