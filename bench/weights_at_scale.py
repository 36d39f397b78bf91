#!/usr/bin/env python
"""A model of one weight update at cluster scale: V bytes from the hub to N generators through the relay tree.

Inputs: version size, generators, NIC bandwidth (per node, full duplex), chunk size, relay fan-out, per-hop
efficiency (the measured ratio of the transport to a raw TCP copy, `bench/weights_bench.py`), the fraction of
bytes a delta sends, a per-hop latency, and optionally the rate at which one node verifies what it receives (xxh3
on one core: xxhash holds the GIL, so it does not spread over threads), the learner's time to encode and hash
a version (or make a delta) before its first chunk leaves (`make gpu-check`'s weights section measures both on a
GPU machine), and the CPU time a node spends applying a delta (`bench/weights_bench.py --delta-wire`).

Model (pipelined by chunk, `scalerl.weights.grpc` + the hub's `RelayTree`):
- every node (the hub included) streams to at most f children; counted in bytes of the version, a stream moves
  at  R = 1 / max(w, c),  w = f * d / (ratio * B),  c = 1 / H + A  (seconds per version byte): its egress is
  shared by f streams and carries d bytes per version byte (d: the fraction a delta sends); its ingress carries
  one stream, whose every chunk it verifies at H after patching (a delta's changed chunks are hashed whole), on
  the thread that applied the patch at A seconds per version byte (deltas only);
- a tree of N nodes with fan-out f has depth D (chain: D = N); the last node holds the last chunk after
  T = P * V + V / R + (D - 1) * (C * (w + c) + latency)   (the learner's preparation P per byte, then fill the
  pipe once and drain it D-1 chunks deep; a relay receives, checks and forwards a chunk one after the other);
- without the relay (every generator streams from the hub): T = P * V + V * max(N * d / (ratio * B), c).
NIC limit = V / B: one copy of the version over one NIC (16 GB at 400 Gb/s = 0.32 s). Goal: T <= 2x that.

Usage: python bench/weights_at_scale.py [--gb 16] [--generators 64] [--nic-gbps 400] [--ratio 0.7 ...]
       [--chunk-mib 1 ...] [--fanout 1 2 4] [--delta-fraction 1.0] [--latency-us 50] [--hash-gbs 0]
       [--prep-s-per-gb 0] [--apply-s-per-gb 0] [--markdown]
"""

from __future__ import annotations

import argparse
import math


def depth(n: int, fanout: int) -> int:
    """Levels of a complete fan-out-ary tree of n nodes under the hub (the hub is level 0)."""
    if fanout == 1:
        return n
    levels, capacity, width = 0, 0, 1
    while capacity < n:
        width *= fanout
        capacity += width
        levels += 1
    return levels


def update_seconds(version_bytes: float, n: int, nic_bps: float, chunk_bytes: float, fanout: int, ratio: float,
                   delta_fraction: float = 1.0, latency_s: float = 50e-6, hash_bps: float = 0.0,
                   prep_s_per_byte: float = 0.0, apply_s_per_byte: float = 0.0) -> float:
    """`hash_bps` 0: verification keeps up with the NIC; `prep_s_per_byte` 0: the learner sends at once;
    `apply_s_per_byte` (deltas only) 0: applying a delta keeps up."""
    wire_s = fanout * delta_fraction / (ratio * nic_bps)  # per version byte
    node_s = _node_s_per_byte(delta_fraction, hash_bps, apply_s_per_byte)
    d = depth(n, fanout)
    return (prep_s_per_byte * version_bytes + version_bytes * max(wire_s, node_s)
            + (d - 1) * (chunk_bytes * (wire_s + node_s) + latency_s))


def _node_s_per_byte(delta_fraction: float, hash_bps: float, apply_s_per_byte: float) -> float:
    """One thread per node receives, patches (a delta) and hashes each chunk: CPU seconds per version byte."""
    return (1 / hash_bps if hash_bps else 0.0) + (apply_s_per_byte if delta_fraction < 1 else 0.0)


def hub_only_seconds(version_bytes: float, n: int, nic_bps: float, ratio: float, delta_fraction: float = 1.0,
                     hash_bps: float = 0.0, prep_s_per_byte: float = 0.0, apply_s_per_byte: float = 0.0) -> float:
    wire_s = n * delta_fraction / (ratio * nic_bps)
    return version_bytes * (prep_s_per_byte + max(wire_s, _node_s_per_byte(delta_fraction, hash_bps,
                                                                           apply_s_per_byte)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=16.0, help="version size, GB (1e9 bytes): an 8B policy in bf16")
    ap.add_argument("--generators", type=int, default=64)
    ap.add_argument("--nic-gbps", type=float, default=400.0, help="per-node NIC, Gb/s, full duplex")
    ap.add_argument("--ratio", type=float, nargs="+", default=[0.7],
                    help="per-hop efficiency vs a raw TCP copy (bench/weights_bench.py measures it)")
    ap.add_argument("--chunk-mib", type=float, nargs="+", default=[1.0, 16.0])
    ap.add_argument("--fanout", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--delta-fraction", type=float, default=1.0, help="bytes a delta update sends / version size")
    ap.add_argument("--latency-us", type=float, default=50.0, help="per hop, per chunk")
    ap.add_argument("--hash-gbs", type=float, default=0.0,
                    help="GB/s at which one node verifies chunks (0: not a limit); an H200 machine's core: 6.55")
    ap.add_argument("--prep-s-per-gb", type=float, default=0.0,
                    help="the learner's encode + hash time per GB before sending (0: none)")
    ap.add_argument("--apply-s-per-gb", type=float, default=0.0,
                    help="a node's CPU time per GB of version to apply a delta, verification apart (0: none)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not 0 < args.delta_fraction <= 1:
        ap.error("--delta-fraction must be in (0, 1]")

    v, nic = args.gb * 1e9, args.nic_gbps * 1e9 / 8
    limit = v / nic
    print(f"{args.gb:g} GB to {args.generators} generators, NIC {args.nic_gbps:g} Gb/s: NIC limit "
          f"{limit:.3f} s per hop, goal <= {2 * limit:.3f} s; delta fraction {args.delta_fraction:g}; verification "
          f"{f'{args.hash_gbs:g} GB/s per node' if args.hash_gbs else 'not a limit'}; learner preparation "
          f"{args.prep_s_per_gb:g} s per GB; applying a delta {args.apply_s_per_gb:g} s per GB.\n")
    extra = {"hash_bps": args.hash_gbs * 1e9, "prep_s_per_byte": args.prep_s_per_gb / 1e9,
             "apply_s_per_byte": args.apply_s_per_gb / 1e9}
    print("| per-hop ratio | relay | chunk | depth | time per update | / NIC limit | goal (<= 2x) |")
    print("|---|---|---|---|---|---|---|")
    for ratio in args.ratio:
        t = hub_only_seconds(v, args.generators, nic, ratio, args.delta_fraction, **extra)
        print(f"| {ratio:g} | none (hub streams to each) | - | 1 | {t:.2f} s | {t / limit:.1f}x | "
              f"{'met' if t <= 2 * limit else 'not met'} |")
        for fanout in args.fanout:
            for chunk in args.chunk_mib:
                t = update_seconds(v, args.generators, nic, chunk * 2**20, fanout, ratio, args.delta_fraction,
                                   args.latency_us * 1e-6, **extra)
                name = "chain" if fanout == 1 else f"tree, fan-out {fanout}"
                print(f"| {ratio:g} | {name} | {chunk:g} MiB | {depth(args.generators, fanout)} | {t:.3f} s | "
                      f"{t / limit:.2f}x | {'met' if t <= 2 * limit else 'not met'} |")
    # the ratio a chain needs to meet the goal at the first chunk size
    c = args.chunk_mib[0] * 2**20
    lo, hi = 1e-3, 1.0
    if update_seconds(v, args.generators, nic, c, 1, hi, args.delta_fraction, args.latency_us * 1e-6,
                      **extra) > 2 * limit:
        print("\nA chain cannot meet the goal at any per-hop ratio with these inputs.")
        return
    for _ in range(60):
        mid = (lo + hi) / 2
        ok = update_seconds(v, args.generators, nic, c, 1, mid, args.delta_fraction, args.latency_us * 1e-6,
                            **extra)
        lo, hi = (lo, mid) if ok <= 2 * limit else (mid, hi)
    print(f"\nA chain with {args.chunk_mib[0]:g} MiB chunks meets the goal from a per-hop ratio of "
          f"{math.ceil(hi * 100) / 100:.2f}.")


if __name__ == "__main__":
    main()
