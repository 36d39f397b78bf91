#!/usr/bin/env python
"""Weight-broadcast benchmark, side by side with raw loopback TCP in one run.

1. Per hop: a raw loopback TCP copy (sendall -> recv_into, no framing, no hashing) of the blob, then
   - learner -> hub: `Publish` of the blob, each chunk xxh3-verified by the hub as it arrives;
   - hub -> generator: `Fetch` of the version, each chunk verified by the client as it arrives;
   - learner -> hub -> generator: publish until an already-subscribed generator holds the verified version
     (two hops, pipelined by chunk).
   each on both data planes (`tcp`: raw sockets; `grpc`: gRPC streams), after `WARMUP` versions so receive
   buffers are reused as in a run's steady state. Ratio = raw time / hop time (goal >= 0.7 per hop).
2. Relayed fan-out: publish until the last of 1, 2, 4 generators holds the version, every generator a process
   with its own relay server (chain = fan-out 1; tree = fan-out 2), with the CPU-seconds all processes spent
   (on a box with fewer cores than processes, the time follows the CPU work).  Goal: 4 <= 1.3x of 1.
3. `--encode`: the learner's encoding of a version (GPU tensors when there is a GPU): the former one vs the
   reused staging buffers.
4. `--delta`: the fraction of bytes that change per optimizer step on the tiny model (policy loss of the
   learner, AdamW), published as bf16 and as fp32, and the bytes a delta publish sends.
5. `--delta-wire CHANGE`: the relayed chain again with each version a delta of the one before (CHANGE of its
   16-bit words changed; 0.0123 is the tiny model's bf16 fraction per step), side by side with whole versions;
   and the CPU a delta costs where it is made (the learner) and where it is applied (every generator).

The hub runs in its own process; the publisher is this process; times are CLOCK_MONOTONIC across processes.

Usage: python bench/weights_bench.py [--mib 64] [--reps 3] [--markdown] [--delta] [--encode] [--chunk-kib 1024]
       [--planes tcp grpc] [--delta-wire 0.0123]
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
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WARMUP = 6
"""Versions sent before timing: a store keeps a few versions, so receive buffers are reused (memory already
mapped) only from the sixth version on, as in a run's steady state."""
sys.path.insert(0, str(ROOT / "services" / "weight-broadcast"))
sys.path.insert(0, str(ROOT / "services" / "learner"))


def serve(port_q, fanout: int, verify_threads: int | None = None) -> None:
    from concurrent import futures

    if verify_threads is not None:
        from scalerl.weights import chunked

        chunked.VERIFY_THREADS = verify_threads

    import grpc

    from scalerl.serving import GRPC_OPTIONS
    from scalerl_weight_broadcast.service import WeightBroadcastService, add_to_server

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=GRPC_OPTIONS)
    service = WeightBroadcastService(poll_s=0.2, relay_fanout=fanout)
    service.serve_data("127.0.0.1", 0)
    add_to_server(service, server)
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def start_hub(fanout: int, verify_threads: int | None = None):
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    proc = ctx.Process(target=serve, args=(port_q, fanout, verify_threads), daemon=True)
    proc.start()
    return proc, f"127.0.0.1:{port_q.get(timeout=60)}"


def first_chunks() -> dict[int, float]:
    """When chunk 0 of each version reached this process (`Incoming.add` timed; nothing else changes)."""
    from scalerl.weights.chunked import Incoming

    first: dict[int, float] = {}
    add = Incoming.add

    def timed(self, raw, chunk, data=None):
        if chunk.seq == 0:
            first[chunk.version] = time.monotonic()
        return add(self, raw, chunk, data)

    Incoming.add = timed
    return first


def subscriber(addr: str, job: str, versions: int, relay: bool, ready, out_q, plane: str,
               verify_threads: int | None = None) -> None:
    from scalerl.weights import chunked
    from scalerl.weights.grpc import GrpcStreamTransport

    if verify_threads is not None:
        chunked.VERIFY_THREADS = verify_threads

    first = first_chunks()
    t = GrpcStreamTransport(addr, relay=relay, relay_host="127.0.0.1", data_plane=plane)
    stop = threading.Event()
    ready.set()
    n = 0
    for w in t.subscribe(job, -1, stop):  # every chunk verified as it arrives
        out_q.put((w.version, time.monotonic(), len(w.blob), first.pop(w.version, float("nan"))))
        n += 1
        if n == versions:
            break
    stop.set()
    time.sleep(2.0)  # keep relaying until the others are done
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


def raw_receiver(port_q, size: int, reps: int) -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    port_q.put(srv.getsockname()[1])
    buf = bytearray(size)
    view = memoryview(buf)
    for _ in range(reps):
        conn, _ = srv.accept()
        got = 0
        while got < size:
            got += conn.recv_into(view[got:])
        conn.sendall(b"k")
        conn.close()


def raw_tcp_chunked(blob: bytes, chunk: int, reps: int) -> float:
    """The stronger floor: two processes, the blob sent as `chunk`-sized sendalls into a reused buffer (no
    framing, no hashing); best of `reps`."""
    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    proc = ctx.Process(target=raw_receiver, args=(port_q, len(blob), reps + 1), daemon=True)
    proc.start()
    port = port_q.get(timeout=60)
    view, times = memoryview(blob), []
    for _ in range(reps + 1):
        with socket.create_connection(("127.0.0.1", port)) as cli:
            t0 = time.monotonic()
            for i in range(0, len(blob), chunk):
                cli.sendall(view[i:i + chunk])
            assert cli.recv(1) == b"k"
            times.append(time.monotonic() - t0)
    proc.join(10)
    return min(times[1:])


def null_serve(port_q, mib: int, chunk: int) -> None:
    """gRPC Python's own floor: a stream of pre-built bytes messages, no parsing, no hashing, no copies."""
    from concurrent import futures

    import grpc

    from scalerl.serving import GRPC_OPTIONS

    blob = os.urandom(mib << 20)
    frames = [blob[i:i + chunk] for i in range(0, len(blob), chunk)]
    handler = grpc.unary_stream_rpc_method_handler(lambda req, ctx: iter(frames), request_deserializer=bytes,
                                                   response_serializer=bytes)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), options=GRPC_OPTIONS)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("bench.Null", {"S": handler}),))
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    server.start()
    server.wait_for_termination()


def grpc_floor(mib: int, chunk: int, reps: int) -> float:
    import grpc

    from scalerl.serving import GRPC_OPTIONS

    ctx = mp.get_context("spawn")
    port_q = ctx.Queue()
    proc = ctx.Process(target=null_serve, args=(port_q, mib, chunk), daemon=True)
    proc.start()
    ch = grpc.insecure_channel(f"127.0.0.1:{port_q.get(timeout=60)}", options=GRPC_OPTIONS)
    call = ch.unary_stream("/bench.Null/S", request_serializer=bytes, response_deserializer=bytes)
    times = []
    for _ in range(reps + 1):
        t0 = time.monotonic()
        assert sum(len(f) for f in call(b"")) == mib << 20
        times.append(time.monotonic() - t0)
    ch.close()
    proc.terminate()
    return min(times[1:])


def hops(addr: str, blob: bytes, reps: int, chunk: int, plane: str) -> tuple[float, float, float]:
    """Best seconds of learner -> hub (Publish) and hub -> generator (Fetch), each verified per chunk; the
    fetched version as the generator gets it (one contiguous blob). Third: the same Publish with the whole
    version hashed before its first chunk leaves (as before session 13), interleaved with the first."""
    from scalerl.weights.grpc import GrpcStreamTransport

    t = GrpcStreamTransport(addr, chunk_bytes=chunk, delta=False, data_plane=plane)
    first = GrpcStreamTransport(addr, chunk_bytes=chunk, delta=False, data_plane=plane)
    first.hash_ahead = False
    pub, fetch, hashed_first = [], [], []
    job = f"bench-hop-{plane}"
    for v in range(0, 2 * (reps + WARMUP), 2):
        t0 = time.monotonic()
        t.publish_bytes(job, v, blob)
        pub.append(time.monotonic() - t0)
        t0 = time.monotonic()
        got = t.fetch(job, v)
        fetch.append(time.monotonic() - t0)
        assert len(got.blob) == len(blob)
        del got  # the generator loads a version, then lets it go (its buffer is reused)
        t0 = time.monotonic()
        first.publish_bytes(job, v + 1, blob)
        hashed_first.append(time.monotonic() - t0)
    t.close()
    first.close()
    return min(pub[WARMUP:]), min(fetch[WARMUP:]), min(hashed_first[WARMUP:])


def cpu_seconds(pids: list[int]) -> float:
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def deliver(addr: str, job: str, blob: bytes, n_subs: int, versions: int, chunk: int, relay: bool = True,
            plane: str = "tcp", hub_pid: int = 0, cpu: list | None = None, stages: list | None = None,
            change: float = 0.0, verify_threads: int | None = None) -> list[float]:
    """Seconds from Publish start until the last subscriber holds each version; with `cpu`, the CPU-seconds every
    process (hub, publisher, subscribers) spent per version are appended to it; with `stages`, per version the
    seconds until the hub held it whole (Publish answered) and until chunk 0 reached the last subscriber to get
    it (pipelined: about one chunk's time per hop; store-and-forward: a whole version's time per hop). With
    `change`, each version after the first is the one before with that fraction of its 16-bit words changed, and
    the publisher sends deltas."""
    from scalerl.weights.grpc import GrpcStreamTransport

    ctx = mp.get_context("spawn")
    out_q = ctx.Queue()
    readies = [ctx.Event() for _ in range(n_subs)]
    procs = [ctx.Process(target=subscriber, args=(addr, job, versions, relay, r, out_q, plane, verify_threads))
             for r in readies]
    for p in procs:
        p.start()
    for r in readies:
        r.wait(60)
    pub = GrpcStreamTransport(addr, chunk_bytes=chunk, delta=change > 0, data_plane=plane)
    time.sleep(1.5)  # subscriptions open, relay tree built
    rng = np.random.default_rng(0)
    times = []
    pids = [os.getpid(), *([hub_pid] if hub_pid else []), *(p.pid for p in procs)]
    for v in range(versions):
        if change > 0 and v > 0:
            blob = changed_copy(blob, change, rng)
        c0 = cpu_seconds(pids) if cpu is not None else 0.0
        t0 = time.monotonic()
        pub.publish_bytes(job, v, blob)  # the wire level: random bytes, not tensors
        published = time.monotonic() - t0
        ends = [out_q.get(timeout=120) for _ in range(n_subs)]
        assert all(e[0] == v and e[2] == len(blob) for e in ends), ends
        times.append(max(e[1] for e in ends) - t0)
        if stages is not None:
            stages.append((published, max(e[3] for e in ends) - t0))
        if cpu is not None:
            time.sleep(0.2)  # the last relays finish their sends
            cpu.append(cpu_seconds(pids) - c0)
    pub.close()
    for p in procs:
        p.join(30)
    return times


def changed_copy(blob: bytes, change: float, rng) -> bytes:
    """`blob` with `change` of its 16-bit words flipped in their lowest bit, spread uniformly (as AdamW's small
    steps change bf16 words)."""
    words = np.frombuffer(blob, dtype="<u2").copy()
    words[rng.choice(len(words), int(change * len(words)), replace=False)] ^= 1
    return words.tobytes()


def delta_cpu(mib: int, chunk: int, change: float, reps: int) -> dict[str, float]:
    """Median seconds per version of what a delta costs in CPU, no wire: the learner hashing a new version and
    finding its changed words against the last one (`ChunkedVersion.from_blob` + `delta_headers`) on one thread
    and on the transport's `DELTA_THREADS`, side by side; and a generator applying the delta to its copy of the
    base as the TCP plane does (a pooled buffer, each message verified)."""
    from scalerl.weights import chunked
    from scalerl.weights.chunked import BufferPool, ChunkedVersion, Incoming

    rng = np.random.default_rng(0)
    old = os.urandom(mib << 20)
    base = ChunkedVersion.from_blob("d", 1, old, chunk)
    pool = BufferPool(max_buffers=2)
    threads = chunked.DELTA_THREADS
    made: dict[int, list[float]] = {1: [], threads: []}
    applied = []
    for r in range(reps + 1):
        new = changed_copy(old, change, rng)
        for n in made:
            chunked.DELTA_THREADS = n
            t = time.perf_counter()
            delta = ChunkedVersion.from_blob("d", 2 + r, new, chunk).delta_headers(base)
            made[n].append(time.perf_counter() - t)
        chunked.DELTA_THREADS = threads
        wire = [(h.SerializeToString(), h, d) for h, d in delta]
        t = time.perf_counter()
        incoming = Incoming(wire[0][1], base, pool=pool)
        for raw, h, d in wire:
            result = incoming.add((raw, d), h, d)
        applied.append(time.perf_counter() - t)
        assert bytes(result.blob) == new
        del incoming, result
    return {**{f"learner: hash + find the changed words, {n} thread{'s' * (n > 1)}": statistics.median(ts[1:])
               for n, ts in made.items()},
            "generator: apply + verify, into its buffer (one thread)": statistics.median(applied[1:]),
            "sent": sum(len(d) for _, d in delta) / len(old)}


def usable_cpus() -> str:
    """The CPUs the benchmark can use, in words (`scalerl.cpus`: affinity and cgroup quota cap "cores busy")."""
    from scalerl.cpus import affinity_cpus, cgroup_cpu_quota

    quota = cgroup_cpu_quota()
    return (f"{os.cpu_count()} CPUs, {affinity_cpus()} in this process's affinity, "
            + ("no cgroup CPU quota" if quota is None else f"a cgroup quota of {quota:.2f} CPUs"))


def encode_times(mib: int, reps: int) -> tuple[str, float, float]:
    """Seconds to encode a `mib` bf16 version in 32 tensors (on the GPU when there is one), median of `reps`:
    the former encoding (`.cpu()` of each tensor, then safetensors.save) and the staging buffers the transports
    use now, rotating as from publish to publish."""
    import torch
    from safetensors.torch import save

    from scalerl.weights.codec import StagingBuffers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = mib * 2**20 // 2 // 32 // 1024
    state = {f"layers.{i}.weight": torch.randn(rows, 1024, device=device).to(torch.bfloat16) for i in range(32)}
    staging, kept = StagingBuffers(count=2), [None]

    def staged() -> None:
        with staging.encoded(state, keep=kept[0]) as blob:
            kept[0] = blob

    def median_s(fn) -> float:
        fn()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    return device, median_s(lambda: save({k: v.cpu() for k, v in state.items()})), median_s(staged)


def hash_rates(mib: int, reps: int) -> Iterator[tuple[int, float]]:
    """(threads, GB/s) of xxh3-64 over a `mib` version in 1 MiB chunks, the chunks shared out over 1, 2, 4, ...
    threads up to the usable CPUs (median of `reps`): how far verification could spread over a node's cores
    (xxhash lets go of the GIL on inputs over 64 KiB)."""
    from concurrent.futures import ThreadPoolExecutor

    from scalerl.cpus import usable_cpus as cpus
    from scalerl.weights.chunked import chunk_hash, split

    blob = np.random.default_rng(0).integers(0, 256, mib * 2**20, dtype=np.uint8).tobytes()
    chunks = split(blob, 2**20)
    threads = 1
    while threads <= max(1, int(cpus())):
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(chunk_hash, chunks))
            times = []
            for _ in range(reps):
                t = time.perf_counter()
                list(pool.map(chunk_hash, chunks))
                times.append(time.perf_counter() - t)
        yield threads, len(blob) / statistics.median(times) / 1e9
        threads *= 2


def delta_fraction(steps: int, lrs: list[float], model_dir: str = "") -> Iterator[tuple]:
    """The tiny model (or the HF model in `model_dir`), a few learner policy-loss steps per lr: fraction of
    bf16 / fp32 bytes changed per step and what a delta publish of the bf16 version sends."""
    import tempfile

    import torch
    from transformers import LlamaForCausalLM

    from scalerl.models import build_tiny_model
    from scalerl.recipe import CispoLossConfig
    from scalerl.weights.chunked import ChunkedVersion
    from scalerl.weights.codec import to_safetensors
    from scalerl_learner.losses import policy_loss

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(model_dir) if model_dir else build_tiny_model(Path(tmp), sft_steps=100)
        for lr in lrs:
            torch.manual_seed(0)
            model = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
            optim = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
            cfg = CispoLossConfig()
            prev16 = prev32 = None
            fr16, fr32, sent = [], [], []
            for _ in range(steps + 1):
                sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
                blob16 = to_safetensors({k: v.to(torch.bfloat16) for k, v in sd.items()})
                blob32 = to_safetensors(sd)
                cur16 = ChunkedVersion.from_blob("d", len(fr16) + 1, blob16, 256 * 1024)
                if prev16 is not None:
                    fr16.append(changed(prev16.blob, blob16, 2))
                    fr32.append(changed(prev32, blob32, 4))
                    sent.append(sum(len(m.data) for m in cur16.delta_messages(prev16)) / len(blob16))
                prev16, prev32 = cur16, blob32
                ids = torch.randint(3, min(model.config.vocab_size, 2000), (16, 24))
                logits = model(input_ids=ids).logits[:, :-1].float()
                new_lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
                adv = torch.randn(16)
                out = policy_loss(new_lp, new_lp.detach(), torch.ones_like(new_lp, dtype=torch.bool), adv,
                                  torch.arange(16) // 4, cfg)
                optim.zero_grad()
                out.loss.backward()
                optim.step()
            yield lr, statistics.mean(fr16), statistics.mean(fr32), statistics.mean(sent)


def changed(a: bytes, b: bytes, width: int) -> float:
    import numpy as np

    n = len(a) // width * width
    dt = {2: "<u2", 4: "<u4"}[width]
    return float((np.frombuffer(a[:n], dt) != np.frombuffer(b[:n], dt)).mean())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--chunk-kib", type=int, default=1024, help="chunk size (the transport default: 1 MiB)")
    ap.add_argument("--fanout", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--subs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--planes", nargs="+", default=["tcp", "grpc"], choices=["tcp", "grpc"])
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--delta", action="store_true", help="also measure the changed fraction on the tiny model")
    ap.add_argument("--skip-wire", action="store_true")
    ap.add_argument("--encode", action="store_true", help="also time the learner's encoding of a version")
    ap.add_argument("--verify-threads", type=int, nargs="*", default=[], metavar="N",
                    help="also deliver through a chain with each of these VERIFY_THREADS (0: on the receiving "
                         "thread), side by side")
    ap.add_argument("--delta-model", default="", help="HF model directory for --delta (default: the tiny model)")
    ap.add_argument("--delta-lrs", type=float, nargs="+", default=[5e-7, 1e-6, 1e-5])
    ap.add_argument("--delta-steps", type=int, default=3)
    ap.add_argument("--delta-wire", type=float, default=0.0, metavar="CHANGE",
                    help="also send deltas with this fraction of 16-bit words changed per version (chain)")
    args = ap.parse_args()
    chunk = args.chunk_kib * 1024
    out = print
    if not args.skip_wire:
        blob = os.urandom(args.mib * 1024 * 1024)
        mib = len(blob) / 2**20
        hub, addr = start_hub(2)
        raw = min(raw_tcp(blob) for _ in range(args.reps))
        floor = grpc_floor(args.mib, chunk, args.reps)
        raw2 = raw_tcp_chunked(blob, chunk, args.reps)
        rows = [("raw loopback TCP copy (1 hop)", raw),
                (f"raw loopback TCP, two processes, {args.chunk_kib} KiB sendalls into a reused buffer (1 hop)", raw2),
                ("gRPC Python floor: null stream of pre-built messages (1 hop)", floor)]
        for plane in args.planes:
            pub, fetch, hashed_first = hops(addr, blob, args.reps, chunk, plane)
            e2e = min(deliver(addr, f"bench-1-{plane}", blob, 1, args.reps + WARMUP, chunk, relay=False,
                              plane=plane)[WARMUP:])
            rows += [(f"{plane}: learner -> hub, verified (Publish)", pub),
                     (f"{plane}: the same, the version hashed whole before its first chunk leaves", hashed_first),
                     (f"{plane}: hub -> generator, verified (Fetch)", fetch),
                     (f"{plane}: learner -> hub -> generator, verified, pipelined (2 hops)", e2e)]
        rows.append(("raw loopback TCP copy again (after the rest)", min(raw_tcp(blob) for _ in range(args.reps))))
        hub.terminate()
        fan, fan_cpu, fan_stages = {}, {}, {}
        for plane in args.planes:
            for fanout in args.fanout:
                hub, addr = start_hub(fanout)
                for n in args.subs:
                    cpu: list[float] = []
                    stages: list[tuple[float, float]] = []
                    fan[plane, fanout, n] = statistics.median(
                        deliver(addr, f"bench-fan-{plane}-{fanout}-{n}", blob, n, args.reps + WARMUP, chunk,
                                plane=plane, hub_pid=hub.pid, cpu=cpu, stages=stages)[WARMUP:])
                    fan_cpu[plane, fanout, n] = statistics.median(cpu[WARMUP:])
                    fan_stages[plane, fanout, n] = [statistics.median(s) for s in zip(*stages[WARMUP:])]
                hub.terminate()
        out(f"Blob {mib:.0f} MiB in {args.chunk_kib} KiB chunks, best of {args.reps}; {usable_cpus()}.\n")
        out("| path | time | throughput | raw TCP / this | two-process raw TCP / this |\n|---|---|---|---|---|")
        for name, t in rows:
            out(f"| {name} | {t * 1e3:.1f} ms | {mib / t:.0f} MiB/s | {raw / t:.2f} | {raw2 / t:.2f} |")
        out("\n| plane | fan-out | generators | time to the last (median) | vs 1 generator | hub holds it (Publish "
            "answered) | chunk 0 at the last generator | CPU-seconds, all processes | cores busy (CPU / time) |"
            "\n|---|---|---|---|---|---|---|---|---|")
        for (plane, fanout, n), t in fan.items():
            c = fan_cpu[plane, fanout, n]
            published, first = fan_stages[plane, fanout, n]
            out(f"| {plane} | {'chain' if fanout == 1 else f'tree {fanout}'} | {n} | {t * 1e3:.0f} ms | "
                f"{t / fan[plane, fanout, args.subs[0]]:.2f}x | {published * 1e3:.0f} ms | {first * 1e3:.1f} ms | "
                f"{c:.3f} | {c / t:.2f} |")
    if args.delta_wire > 0:
        blob = os.urandom(args.mib * 1024 * 1024)
        out(f"\nDeltas: {args.mib} MiB versions, {args.delta_wire:.2%} of the 16-bit words changed per version, "
            f"a chain; side by side with whole versions ({usable_cpus()}):\n"
            "\n| plane | generators | sent as | time to the last (median) | hub holds it | chunk 0 at the last "
            "generator | CPU-seconds, all processes |\n|---|---|---|---|---|---|---|")
        for plane in args.planes:
            hub, addr = start_hub(1)
            for n in args.subs:
                for change in (0.0, args.delta_wire):
                    cpu, stages = [], []
                    t = statistics.median(deliver(addr, f"bench-delta-{plane}-{n}-{change}", blob, n,
                                                  args.reps + WARMUP, chunk, plane=plane, hub_pid=hub.pid, cpu=cpu,
                                                  stages=stages, change=change)[WARMUP:])
                    published, first = [statistics.median(s) for s in zip(*stages[WARMUP:])]
                    out(f"| {plane} | {n} | {'delta' if change else 'whole'} | {t * 1e3:.0f} ms | "
                        f"{published * 1e3:.0f} ms | {first * 1e3:.1f} ms | {statistics.median(cpu[WARMUP:]):.3f} |",
                        flush=True)
            hub.terminate()
        costs = delta_cpu(args.mib, chunk, args.delta_wire, args.reps)
        sent = costs.pop("sent")
        out(f"\nCPU of one delta ({sent:.2%} of the version sent), median of {args.reps}:\n"
            "\n| where | per version | per GiB |\n|---|---|---|")
        for name, t in costs.items():
            out(f"| {name} | {t * 1e3:.1f} ms | {t * 1024 / args.mib:.3f} s |")
    if args.verify_threads:
        blob = os.urandom(args.mib * 1024 * 1024)
        hubs = {vt: start_hub(1, vt) for vt in args.verify_threads}
        out(f"\nVerifying arriving chunks on the receiving thread (0) or on verify threads, TCP plane, a chain, "
            f"{args.mib} MiB whole versions, side by side ({usable_cpus()}):\n"
            "\n| generators | verify threads (hub and generators) | time to the last (median) | chunk 0 at the last "
            "generator | CPU-seconds, all processes |\n|---|---|---|---|---|")
        for n in args.subs:
            for vt, (hub, addr) in hubs.items():
                cpu, stages = [], []
                t = statistics.median(deliver(addr, f"bench-verify-{n}-{vt}", blob, n, args.reps + WARMUP, chunk,
                                              hub_pid=hub.pid, cpu=cpu, stages=stages, verify_threads=vt)[WARMUP:])
                first = statistics.median(s[1] for s in stages[WARMUP:])
                out(f"| {n} | {vt} | {t * 1e3:.0f} ms | {first * 1e3:.1f} ms | {statistics.median(cpu[WARMUP:]):.3f} |",
                    flush=True)
        for hub, _ in hubs.values():
            hub.terminate()
    if args.encode:
        device, former, staged = encode_times(args.mib, args.reps)
        out(f"\nEncoding a {args.mib} MiB bf16 version (32 tensors on {device}), median of {args.reps}:"
            "\n\n| encoding | time | vs staged |\n|---|---|---|")
        out(f"| former: `.cpu()` per tensor, then safetensors.save | {former * 1e3:.1f} ms | {former / staged:.1f}x |")
        out(f"| staging buffers (reused; page-locked for GPU tensors) | {staged * 1e3:.1f} ms | 1.0x |")
        rates = list(hash_rates(args.mib, args.reps))
        out(f"\nHashing (xxh3-64 per 1 MiB chunk) a {args.mib} MiB version on 1-{rates[-1][0]} threads: "
            + ", ".join(f"{n}: {gbs:.2f} GB/s ({gbs / rates[0][1]:.2f}x)" for n, gbs in rates))
    if args.delta:
        out("\n| lr | bf16 bytes changed / step | fp32 bytes changed / step | bf16 delta publish sends |"
            "\n|---|---|---|---|")
        for lr, f16, f32, sent in delta_fraction(args.delta_steps, args.delta_lrs, args.delta_model):
            out(f"| {lr:g} | {f16:.2%} | {f32:.2%} | {sent:.2%} of the version |", flush=True)


if __name__ == "__main__":
    main()
