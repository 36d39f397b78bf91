"""GeneratorScaler against a fake Kubernetes API server at its HTTP boundary.

The fake is a real HTTP server on 127.0.0.1 (in a thread) that answers the scale subresource like the
API server does and records every request, so the tests assert the exact wire request: method, path,
query, content type and body.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest
from kubernetes import client

from scalerl_api.scaler import MERGE_PATCH, GeneratorScaler, ScaleFailed, ScaleRefused

NS = "scalerl"
DEPLOY = "scalerl-generator"
SCALE_PATH = f"/apis/apps/v1/namespaces/{NS}/deployments/{DEPLOY}/scale"


class FakeKubeAPI:
    def __init__(self, replicas: int = 2) -> None:
        self.replicas = replicas
        self.requests: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _record(self) -> dict:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                url = urlsplit(self.path)
                req = {
                    "method": self.command,
                    "path": url.path,
                    "query": url.query,
                    "content_type": self.headers.get("Content-Type"),
                    "body": json.loads(raw) if raw else None,
                }
                fake.requests.append(req)
                return req

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _scale_obj(self) -> dict:
                return {
                    "kind": "Scale",
                    "apiVersion": "autoscaling/v1",
                    "metadata": {"name": DEPLOY, "namespace": NS},
                    "spec": {"replicas": fake.replicas},
                    "status": {"replicas": fake.replicas, "selector": "app.kubernetes.io/component=generator"},
                }

            def _not_found(self, path: str) -> None:
                self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "message": f"{path} not found", "reason": "NotFound", "code": 404})

            def do_GET(self):  # noqa: N802
                req = self._record()
                if req["path"] != SCALE_PATH:
                    return self._not_found(req["path"])
                self._send(200, self._scale_obj())

            def do_PATCH(self):  # noqa: N802
                req = self._record()
                if req["path"] != SCALE_PATH:
                    return self._not_found(req["path"])
                if req["content_type"] not in (MERGE_PATCH, "application/strategic-merge-patch+json"):
                    return self._send(415, {"kind": "Status", "code": 415, "reason": "UnsupportedMediaType"})
                fake.replicas = req["body"]["spec"]["replicas"]
                self._send(200, self._scale_obj())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def __enter__(self) -> "FakeKubeAPI":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_api():
    with FakeKubeAPI(replicas=2) as fake:
        yield fake


def make_scaler(fake: FakeKubeAPI, deployment: str = DEPLOY, **kw) -> GeneratorScaler:
    cfg = client.Configuration(host=fake.url)
    return GeneratorScaler(namespace=NS, deployment=deployment, min_replicas=kw.pop("min_replicas", 1),
                           max_replicas=kw.pop("max_replicas", 8), api_client=client.ApiClient(cfg), **kw)


def test_get_replicas_reads_scale_subresource(fake_api):
    assert make_scaler(fake_api).get_replicas() == 2
    assert len(fake_api.requests) == 1
    req = fake_api.requests[0]
    assert req["method"] == "GET"
    assert req["path"] == SCALE_PATH
    assert req["body"] is None


def test_scale_sends_merge_patch_of_spec_replicas(fake_api):
    assert make_scaler(fake_api).scale(5) == 5
    assert len(fake_api.requests) == 1
    req = fake_api.requests[0]
    assert req["method"] == "PATCH"
    assert req["path"] == SCALE_PATH
    assert req["content_type"] == "application/merge-patch+json"
    assert req["body"] == {"spec": {"replicas": 5}}
    assert req["query"] == "fieldManager=scalerl-api"
    assert fake_api.replicas == 5


@pytest.mark.parametrize("replicas", [1, 8])
def test_bounds_are_inclusive(fake_api, replicas):
    assert make_scaler(fake_api).scale(replicas) == replicas
    assert fake_api.requests[-1]["body"] == {"spec": {"replicas": replicas}}


@pytest.mark.parametrize("replicas", [0, 9, -1, 1000, 2.0, "3", True, None])
def test_out_of_bounds_refused_without_request(fake_api, replicas):
    scaler = make_scaler(fake_api)
    with pytest.raises(ScaleRefused) as info:
        scaler.scale(replicas)
    assert isinstance(info.value, ValueError)
    msg = str(info.value)
    assert "between 1 and 8" in msg
    assert info.value.min_replicas == 1 and info.value.max_replicas == 8
    assert fake_api.requests == []
    assert fake_api.replicas == 2


def test_scale_to_zero_allowed_when_min_is_zero(fake_api):
    assert make_scaler(fake_api, min_replicas=0).scale(0) == 0
    assert fake_api.requests[0]["body"] == {"spec": {"replicas": 0}}


def test_api_error_surfaces_as_scale_failed(fake_api):
    scaler = make_scaler(fake_api, deployment="missing")
    with pytest.raises(ScaleFailed) as info:
        scaler.scale(3)
    assert info.value.status == 404
    assert fake_api.requests[0]["path"] == f"/apis/apps/v1/namespaces/{NS}/deployments/missing/scale"


def test_invalid_bounds_rejected():
    with pytest.raises(ValueError):
        GeneratorScaler(namespace=NS, min_replicas=5, max_replicas=2, api_client=client.ApiClient())
