"""Readiness (the pod's readinessProbe, gRPC health name ENGINE_HEALTH_NAME) is SERVING only once the vLLM engine
is loaded (or while idle, nothing to load); the overall status stays SERVING for liveness during the load."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap

from scalerl.serving import ServiceRegistration, check_health, start_server
from scalerl_generator.engine import GenerationEngine, on_engine_state
from scalerl_generator.service import ENGINE_HEALTH_NAME, track_engine_readiness

# Runs in its own process: vLLM's in-process engines share global state with the session engine of conftest.
PROBE = textwrap.dedent("""
    import asyncio, json, sys
    from prometheus_client import REGISTRY
    from scalerl.serving import ServiceRegistration, check_health, start_server
    from scalerl_generator.engine import GenerationEngine, on_engine_state
    from scalerl_generator.service import ENGINE_HEALTH_NAME, track_engine_readiness

    running = start_server(ServiceRegistration([], lambda s: None), host="127.0.0.1", grpc_port=0,
                           metrics_port=None)
    addr = f"127.0.0.1:{running.grpc_port}"
    track_engine_readiness(running)
    seen = [("idle", check_health(addr, ENGINE_HEALTH_NAME), check_health(addr))]
    on_engine_state(lambda state: seen.append((state, check_health(addr, ENGINE_HEALTH_NAME), check_health(addr))))

    async def main():
        engine = GenerationEngine(sys.argv[1], max_model_len=64, kv_cache_gib=0.25)
        await engine.start()
        seen.append(("metric", REGISTRY.get_sample_value("scalerl_generator_engine_ready"), ""))
        await engine.shutdown()

    asyncio.run(main())
    running.stop(0)
    print(json.dumps(seen))
""")


def test_readiness_is_serving_only_once_the_engine_is_loaded(tiny_models):
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tiny_models[0])], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = [tuple(s) for s in json.loads(proc.stdout.strip().splitlines()[-1])]
    assert seen == [
        ("idle", "SERVING", "SERVING"),          # no job: nothing to load
        ("loading", "NOT_SERVING", "SERVING"),   # not ready, but alive (liveness must not kill a long load)
        ("ready", "SERVING", "SERVING"),
        ("metric", 1.0, ""),
        ("stopped", "SERVING", "SERVING"),       # job over: idle again
    ], seen


def test_a_failed_engine_is_not_ready(tmp_path):
    running = start_server(ServiceRegistration([], lambda s: None), host="127.0.0.1", grpc_port=0, metrics_port=None)
    untrack = track_engine_readiness(running)
    states = []
    unsubscribe = on_engine_state(states.append)
    try:
        addr = f"127.0.0.1:{running.grpc_port}"
        engine = GenerationEngine(str(tmp_path / "no-such-model"))
        try:
            asyncio.run(engine.start())
        except Exception:  # noqa: BLE001 - whatever the loader raises for a missing model
            pass
        else:
            raise AssertionError("an engine without a model started")
        assert states == ["loading", "failed"]
        assert check_health(addr, ENGINE_HEALTH_NAME) == "NOT_SERVING"
        assert check_health(addr) == "SERVING"
    finally:
        unsubscribe()
        untrack()
        running.stop(0)
