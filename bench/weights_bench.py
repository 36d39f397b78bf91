#!/usr/bin/env python
"""Weight-broadcast benchmark.

1. Throughput: the learner publishes one ~64 MiB blob and one already-subscribed generator receives it
   (sha256-verified), vs a raw loopback TCP socket copy of the same bytes (sendall -> recv_into).  Reported:
   MiB/s of each and the ratio (goal >= 0.7).
2. Fan-out: time from the start of Publish until the last of 1, 2, 4 subscribers holds the verified version
   (goal: nearly flat).

The service runs in its own process (as in production); publisher in this process; each subscriber in its
own process (a generator pod).  Times are CLOCK_MONOTONIC, shared across processes.

Usage: python bench/weights_bench.py [--mib 64] [--reps 3] [--markdown]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services" / "weight-broadcast"))


def serve(port_q) -> None:
    from concurrent import futures

    import grpc

    from scalerl.serving import GRPC_OPTIONS
    from scalerl_weight_broadcast.service import WeightBroadcastService, add_to_server

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=GRPC_OPTIONS)
    add_to_server(WeightBroadcastService(poll_s=0.2), server)
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def subscriber(addr: str, job: str, versions: int, ready, out_q) -> None:
    from scalerl.weights.grpc import GrpcStreamTransport

    t = GrpcStreamTransport(addr)
    stop = threading.Event()
    ready.set()
    n = 0
    for w in t.subscribe(job, -1, stop):  # verify() (sha256) runs inside
        out_q.put((w.version, time.monotonic(), len(w.blob)))
        n += 1
        if n == versions:
            break
    t.close()


def raw_tcp(blob: bytes) -> float:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    buf = bytearray(len(blob))
    done = threading.Event()

    def recv():
        conn, _ = srv.accept()
        view, got = memoryview(buf), 0
        while got < len(buf):
            got += conn.recv_into(view[got:])
        conn.close()
        done.set()

    th = threading.Thread(target=recv)
    th.start()
    cli = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    cli.sendall(blob)
    done.wait()
    dt = time.monotonic() - t0
    cli.close()
    th.join()
    srv.close()
    assert bytes(buf[:16]) == blob[:16]
    return dt


def deliver(addr: str, job: str, blob: bytes, n_subs: int, versions: int) -> list[float]:
    """Seconds from Publish start until the last subscriber holds each version."""
    from scalerl.weights.grpc import GrpcStreamTransport

    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    readies = [ctx.Event() for _ in range(n_subs)]
    procs = [ctx.Process(target=subscriber, args=(addr, job, versions, r, out_q)) for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(60)
    pub = GrpcStreamTransport(addr)
    time.sleep(1.0)  # subscriptions open
    times = []
    for v in range(versions):
        t0 = time.monotonic()
        pub.publish_bytes(job, v, blob)  # the wire level: random bytes, not tensors
        ends = [out_q.get(timeout=120) for _ in range(n_subs)]
        assert all(e[0] == v and e[2] == len(blob) for e in ends), ends
        times.append(max(e[1] for e in ends) - t0)
    pub.close()
    for p in procs:
        p.join(30)
    return times


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    blob = os.urandom(args.mib * 1024 * 1024)
    mib = len(blob) / 2**20

    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    server = ctx.Process(target=serve, args=(port_q,), daemon=True)
    server.start()
    addr = f"127.0.0.1:{port_q.get(timeout=60)}"

    raw = min(raw_tcp(blob) for _ in range(args.reps))
    one = deliver(addr, "bench-1", blob, 1, args.reps + 1)[1:]  # first version warms up the connection
    wb = min(one)
    fan = {n: statistics.median(deliver(addr, f"bench-fan-{n}", blob, n, args.reps + 1)[1:]) for n in (1, 2, 4)}
    server.terminate()

    ratio = raw / wb
    rows = [
        ("raw loopback TCP copy", f"{raw * 1e3:.1f} ms", f"{mib / raw:.0f} MiB/s"),
        ("weight-broadcast publish -> 1 subscriber (verified)", f"{wb * 1e3:.1f} ms", f"{mib / wb:.0f} MiB/s"),
    ]
    if args.markdown:
        print(f"Blob {mib:.0f} MiB, best of {args.reps}; {os.cpu_count()} CPUs.\n")
        print("| path | time | throughput |\n|---|---|---|")
        for r in rows:
            print(f"| {r[0]} | {r[1]} | {r[2]} |")
        print(f"\nRatio weight-broadcast / raw TCP: **{ratio:.2f}** (goal >= 0.7)\n")
        print("| subscribers | time to deliver one version (median) | vs 1 subscriber |\n|---|---|---|")
        for n, t in fan.items():
            print(f"| {n} | {t * 1e3:.0f} ms | {t / fan[1]:.2f}x |")
    else:
        for r in rows:
            print(f"{r[0]:55s} {r[1]:>10s} {r[2]:>12s}")
        print(f"ratio weight-broadcast / raw TCP: {ratio:.2f} (goal >= 0.7)")
        for n, t in fan.items():
            print(f"{n} subscriber(s): {t * 1e3:.0f} ms to deliver one version ({t / fan[1]:.2f}x)")


if __name__ == "__main__":
    main()
