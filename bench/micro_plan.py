"""Microbenchmark of the plan step (policy order + grants + victims) on seeded random snapshots.

Usage: python3 -m bench.micro_plan [--step plan|decide] [--streams 50 500] [--iters 2000]
       [--out results.json]
`--step decide` times the scheduler's whole pure decision instead (`sched.decide.decide`: the
views built from a `Snapshot`, the order, swap-ins, the plan, the victims and their modes) on
seeded snapshots of the same mix (`make_decide_snapshot`). Before each call the snapshot's
per-step objects are built again (untimed), as the adapter builds them right before a real
step decides: the waiting requests (each rid split anew), the slots and the host copies; the
streams' infos and the rids are the long-lived objects they are in a server. `--cycled`
times the 32 snapshots' same objects over and over instead (the measure before 2026-12-06:
colder in cache, about 1.5-2x slower on this 2-core VM). `--speculative-only` leaves only
the turns of partial streams in each snapshot's waiting queue (`speculative_only`): a load of
streams between final contexts, where the head is speculative work and may only swap its
victims out (decide's costliest path: the waiting turns that hold KV are looked at too).
For each stream count, 32 seeded snapshots (see `make_snapshot`) are planned in turn with a token
budget of 8192; each call gets freshly built views (untimed), as a real step plans right after
building them. Prints a markdown table per policy and stream count: wall-clock mean, p50, p99 of
one plan() call in microseconds (time.perf_counter_ns, the targets' measure) after a warm-up, and
the thread CPU time of the same calls (time.thread_time_ns, a second pass: it leaves out time the
OS gave to other processes); then one summary line against the targets: mean < 50 us at 50
streams, p99 < 200 us at 500. GC stays on, as in a real scheduler.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from itertools import repeat
from pathlib import Path

from s2l_sglang.rid import final_rid, turn_rid
from s2l_sglang.sched.decide import (
    HostCopy,
    SlotView,
    Snapshot,
    StreamInfo,
    decide,
    waiting_req,
)
from s2l_sglang.sched.planner import plan
from s2l_sglang.sched.policy import get_policy, policy_names
from s2l_sglang.sched.preemption import get_preemption
from s2l_sglang.sched.snapshot import ReqView

TOKEN_BUDGET = 8192
_new_view = tuple.__new__  # ReqView from a field tuple, fast
TARGET_MEAN_US = {50: 50.0}
TARGET_P99_US = {500: 200.0}


def make_snapshot(rng: random.Random, n: int) -> tuple[list[ReqView], int]:
    """n requests in the shape of a loaded streaming server, and free KV of 0..2 token budgets
    (so that a good share of steps must preempt): decoding 20%, prefilling partial streams 30%,
    idle partial streams 25%, waiting complete requests 15%, prefilling complete streams 10%."""
    views = []
    for _ in range(n):
        arrival = rng.uniform(0.0, 100.0)
        kind = rng.random()
        held = rng.randint(256, 8192)
        decoding, complete, pending = False, True, 0
        if kind < 0.20:
            decoding = True
        elif kind < 0.50:
            complete, pending = False, rng.randint(64, 2048)
        elif kind < 0.75:
            complete = False
        elif kind < 0.90:
            held, pending = 0, rng.randint(1024, 12000)
        else:
            pending = rng.randint(64, 4096)
        state = "idle" if not (decoding or pending) else ("running" if held else "waiting")
        views.append(
            ReqView(
                rid=f"{rng.getrandbits(128):032x}",  # like SGLang's uuid4().hex rids
                is_stream=kind >= 0.20,
                complete=complete,
                arrival=arrival,
                last_chunk=arrival + rng.uniform(0.0, 20.0),
                held=held,
                pending=pending,
                state=state,
                decoding=decoding,
                reclaimable_kv=rng.randint(held // 2, held),
            )
        )
    return views, rng.randint(0, 2 * TOKEN_BUDGET)


def make_decide_snapshot(rng: random.Random, n: int) -> tuple[Snapshot, dict[str, StreamInfo]]:
    """n requests as the adapter would snapshot a loaded server: waiting prefill turns of
    partial streams 30% (a third of them not yet on their slot), idle partial streams 25%,
    streams with a turn running 20%, waiting plain requests 15%, waiting final turns 10%;
    a tenth of the streams have a host copy; free KV of 0..2 token budgets."""
    waiting, slots, host, streams = [], {}, [], {}
    for i in range(n):
        kind = rng.random()
        sid = f"s{i}.{rng.getrandbits(64):016x}"
        arrival = rng.uniform(0.0, 100.0)
        held = rng.randint(256, 8192)
        if kind >= 0.15:
            streams[sid] = StreamInfo(arrival, arrival + rng.uniform(0.0, 20.0), kind >= 0.90)
        if kind < 0.15:
            rid = f"{rng.getrandbits(128):032x}"
            waiting.append(waiting_req(rid, rng.randint(1024, 12000), 0, 128, arrival, False))
        elif kind < 0.45:
            borrowed = rng.random() < 0.67
            slots[sid] = SlotView(sid, held, held, inflight=True)
            waiting.append(
                waiting_req(turn_rid(sid, 2), held + rng.randint(64, 2048), 0, 1, arrival, borrowed)
            )
        elif kind < 0.70:
            slots[sid] = SlotView(sid, held, held, inflight=False)
        elif kind < 0.90:
            slots[sid] = SlotView(sid, held, held, inflight=True)
        else:
            slots[sid] = SlotView(sid, held, held, inflight=True)
            waiting.append(waiting_req(final_rid(sid), held + 64, 0, 128, arrival, False))
        if kind >= 0.15 and sid not in slots and rng.random() < 0.1:
            host.append(HostCopy(sid, held, True))
    free = rng.randint(0, 2 * TOKEN_BUDGET)
    snap = Snapshot(100.0, tuple(waiting), slots, free, free, 0, tuple(host), 4 * TOKEN_BUDGET)
    return snap, streams


def speculative_only(
    snap: Snapshot, streams: dict[str, StreamInfo]
) -> tuple[Snapshot, dict[str, StreamInfo]]:
    """`snap` with only the turns of partial streams waiting (no plain request, no final turn),
    and a reserve for speculative work as a server with one sets it (a quarter token budget)."""
    waiting = tuple(w for w in snap.waiting if w.sid in streams and not streams[w.sid].complete)
    return snap._replace(waiting=waiting, spec_reserve=TOKEN_BUDGET // 4), streams


def percentile(sorted_xs: list[float], q: float) -> float:
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def timed(snaps: list, policy: object, iters: int, clock: Callable[[], int]) -> list[float]:
    """Per-call times in us, sorted. Each call gets freshly built views (untimed), as a real
    step plans right after building them: the timing sees them as warm in cache as it would."""
    out = []
    for k in range(iters):
        fields, free = snaps[k % len(snaps)]
        views = list(map(_new_view, repeat(ReqView), fields))
        t0 = clock()
        plan(views, policy, TOKEN_BUDGET, free)
        out.append((clock() - t0) / 1000.0)
    out.sort()
    return out


def rebuilt(snap: Snapshot) -> Snapshot:
    """`snap` with its per-step objects built again, as `adapter.snapshot` builds them each
    step: the waiting requests (their rids split again), the slots and the host copies."""
    return snap._replace(
        waiting=tuple([waiting_req(*w[:7]) for w in snap.waiting]),
        slots={sid: SlotView(*v) for sid, v in snap.slots.items()},
        host=tuple([HostCopy(*c) for c in snap.host]),
    )


def bench_decide(
    n: int,
    policy_name: str,
    iters: int,
    warmup: int,
    seed: int,
    cycled: bool = False,
    only_speculative: bool = False,
) -> dict:
    """`decide` per call on 32 seeded snapshots (views, order, plan, victims: all timed),
    each rebuilt before the call (untimed; `rebuilt`) unless `cycled`; with only speculative
    turns waiting if `only_speculative` (`speculative_only`)."""
    rng = random.Random(seed * 1000 + n)
    snaps = [make_decide_snapshot(rng, n) for _ in range(32)]
    if only_speculative:
        snaps = [speculative_only(*s) for s in snaps]
    policy, preemption = get_policy(policy_name), get_preemption("swap")

    def run(clock: Callable[[], int], count: int) -> tuple[list[float], list]:
        out, acts = [], []
        for k in range(count):
            snap, streams = snaps[k % len(snaps)]
            if not cycled:
                snap = rebuilt(snap)
            t0 = clock()
            acts.append(decide(snap, streams, policy, preemption))
            out.append((clock() - t0) / 1000.0)
        out.sort()
        return out, acts

    run(time.perf_counter_ns, warmup)
    wall, acts = run(time.perf_counter_ns, iters)
    cpu, _ = run(time.thread_time_ns, iters)
    return {
        **_row(n, policy_name, wall, cpu),
        "preempted_mean": statistics.fmean(len(a.preempt) for a in acts[: len(snaps)]),
        "preempting_share": statistics.fmean(bool(a.preempt) for a in acts[: len(snaps)]),
    }


def _row(n: int, policy_name: str, wall: list[float], cpu: list[float]) -> dict:
    """A result row's timing columns (both lists sorted, in us)."""
    return {
        "streams": n,
        "policy": policy_name,
        "mean_us": statistics.fmean(wall),
        "p50_us": percentile(wall, 0.50),
        "p99_us": percentile(wall, 0.99),
        "cpu_mean_us": statistics.fmean(cpu),
        "cpu_p99_us": percentile(cpu, 0.99),
    }


def bench(n: int, policy_name: str, iters: int, warmup: int, seed: int) -> dict:
    rng = random.Random(seed * 1000 + n)
    snaps = [make_snapshot(rng, n) for _ in range(32)]
    policy = get_policy(policy_name)
    plans = [plan(views, policy, TOKEN_BUDGET, free) for views, free in snaps]
    snaps = [([tuple(v) for v in views], free) for views, free in snaps]
    timed(snaps, policy, warmup, time.perf_counter_ns)
    wall = timed(snaps, policy, iters, time.perf_counter_ns)
    cpu = timed(snaps, policy, iters, time.thread_time_ns)
    return {
        **_row(n, policy_name, wall, cpu),
        "grants_mean": statistics.fmean(len(p.grants) for p in plans),
        "preempting_share": statistics.fmean(p.kv_shortfall > 0 for p in plans),
    }


def view_build_us(n: int, seed: int, reps: int = 50) -> float:
    """Cost of building n ReqViews (the integrator's side of a step), for scale."""
    views, _ = make_snapshot(random.Random(seed), n)
    fields = [tuple(v) for v in views]
    t0 = time.perf_counter_ns()
    for _ in range(reps):
        [ReqView(*f) for f in fields]
    return (time.perf_counter_ns() - t0) / 1000.0 / reps


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_1m": os.getloadavg()[0],
    }


def verdict(rows: list[dict], mean_key: str, p99_key: str) -> tuple[float, float, str]:
    worst_mean = max((r[mean_key] for r in rows if r["streams"] == 50), default=float("nan"))
    worst_p99 = max((r[p99_key] for r in rows if r["streams"] == 500), default=float("nan"))
    checks = [m < TARGET_MEAN_US[50] for m in [worst_mean] if m == m]
    checks += [p < TARGET_P99_US[500] for p in [worst_p99] if p == p]
    return worst_mean, worst_p99, ("PASS" if all(checks) else "FAIL") if checks else "n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=["plan", "decide"], default="plan")
    ap.add_argument("--streams", type=int, nargs="+", default=[50, 500])
    ap.add_argument("--policies", nargs="+", default=policy_names(), choices=policy_names())
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write results JSON here")
    ap.add_argument(
        "--cycled",
        action="store_true",
        help="--step decide: time the same snapshot objects in turn, not rebuilt each call",
    )
    ap.add_argument(
        "--speculative-only",
        action="store_true",
        help="--step decide: only turns of partial streams wait (every head is speculative)",
    )
    args = ap.parse_args()

    before = machine()
    snapshots = None if args.step == "plan" else "cycled" if args.cycled else "rebuilt"
    mix = None if args.step == "plan" else "speculative-only" if args.speculative_only else "mixed"
    run = (
        bench
        if args.step == "plan"
        else partial(bench_decide, cycled=args.cycled, only_speculative=args.speculative_only)
    )
    rows = [
        run(n, pol, args.iters, args.warmup, args.seed)
        for n in args.streams
        for pol in args.policies
    ]
    after = machine()
    counted = "grants" if args.step == "plan" else "preempted"
    print(
        "| streams | policy | mean us | p50 us | p99 us | cpu mean us | cpu p99 us "
        f"| {counted} | preempting |"
    )
    print("|--:|---|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print(
            f"| {r['streams']} | {r['policy']} | {r['mean_us']:.1f} | {r['p50_us']:.1f} "
            f"| {r['p99_us']:.1f} | {r['cpu_mean_us']:.1f} | {r['cpu_p99_us']:.1f} "
            f"| {r.get('grants_mean', r.get('preempted_mean', 0.0)):.1f} "
            f"| {r['preempting_share']:.0%} |"
        )
    build = {n: view_build_us(n, args.seed) for n in args.streams}
    print(
        f"machine: {before['cpu']}, {before['cores']} cores, Python {before['python']}, "
        f"load average {before['loadavg_1m']:.1f} -> {after['loadavg_1m']:.1f}; "
        "building the views (not in plan): "
        + ", ".join(f"{n} streams {us:.0f} us" for n, us in build.items())
    )
    w_mean, w_p99, w_verdict = verdict(rows, "mean_us", "p99_us")
    c_mean, c_p99, c_verdict = verdict(rows, "cpu_mean_us", "cpu_p99_us")
    print(
        f"micro_plan ({args.step}{', cycled' if snapshots == 'cycled' else ''}"
        f"{', speculative only' if mix == 'speculative-only' else ''}): worst mean @50 = {w_mean:.1f} us (target < 50), worst p99 @500 = "
        f"{w_p99:.1f} us (target < 200): {w_verdict} wall-clock; cpu time {c_mean:.1f} / "
        f"{c_p99:.1f} us: {c_verdict}"
    )
    if args.out:
        result = {
            "bench": "micro_plan",
            "step": args.step,
            "token_budget": TOKEN_BUDGET,
            "iters": args.iters,
            "warmup": args.warmup,
            "seed": args.seed,
            "snapshots": snapshots,
            "mix": mix,
            "machine": before,
            "loadavg_1m_after": after["loadavg_1m"],
            "results": rows,
            "view_build_us": build,
            "verdict_wall": w_verdict,
            "verdict_cpu": c_verdict,
        }
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
