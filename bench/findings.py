"""The "what limits each figure" section of docs/benchmarks.md, computed from one run's details.

Each bullet states a measured relation (CPU per item, items per arq job, batch sizes) with its
numbers; nothing here is written by hand, so a new run cannot leave stale prose behind.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .harness import EMBED, FIXED

CORE_MS_PER_S = 1000.0


def total_cpu(cpu: dict[str, float]) -> float:
    return sum(cpu.values())


def bulk_cpu(d: dict[str, Any], cores: int) -> str:
    x = d["p1"][FIXED]
    over, direct = x["overspill"], x["direct"]
    o_cpu, d_cpu = total_cpu(over["cpu_ms_per_item"]), total_cpu(direct["cpu_ms_per_item"])
    batch = over["breakdown"].get("batch_size", 0)
    return (
        f"**CPU per item bounds bulk throughput on this machine.** On the fixed-cost model overspill spent "
        f"{o_cpu:.3f} ms of CPU per item in all processes (load generator "
        f"{over['cpu_ms_per_item'].get('load_generator', 0):.3f}, worker {over['cpu_ms_per_item'].get('worker', 0):.3f}, "
        f"Redis {over['cpu_ms_per_item'].get('redis', 0):.3f}, Triton {over['cpu_ms_per_item'].get('triton', 0):.3f}) "
        f"against {d_cpu:.3f} ms for the direct client; {cores} cores at that cost allow about "
        f"{cores * CORE_MS_PER_S / o_cpu:,.0f} items/s, and the run measured {over['items_per_s']:,.0f} "
        f"(direct {direct['items_per_s']:,.0f}). Triton ran batches of {batch:.0f} items on average "
        f"(at most 64): at 5 ms per execution that is room for ≈ {batch * 200:,.0f} items/s."
    )


def embed_share(d: dict[str, Any], cores: int) -> str:
    x = d["p1"][EMBED]
    cpu = x["overspill"]["cpu_ms_per_item"]
    model = cpu.get("triton", 0)
    queue = total_cpu(cpu) - model
    return (
        f"On the real embedding model the model itself took {model:.2f} ms of CPU per item and the queue's "
        f"processes another {queue:.2f} ms from the same cores: {cores} cores at {model + queue:.2f} ms allow "
        f"≈ {cores * CORE_MS_PER_S / (model + queue):,.0f} items/s; the run measured "
        f"{x['overspill']['items_per_s']:,.0f} against {x['direct']['items_per_s']:,.0f} direct "
        f"(ratio {x['ratio']:.2f})."
    )


def packing(d: dict[str, Any], cores: int) -> str:
    closed = d["p2"][FIXED]["overspill"]
    levels = d["p3"][FIXED]["levels"]
    per_level = ", ".join(
        f"{row['level']:.0%} load {row['overspill'].get('items_per_package', 0):.2f}" for row in levels
    )
    half = min(levels, key=lambda row: abs(row["level"] - 0.5))
    over = half["overspill"]
    return (
        f"**Items per arq job depend on how requests arrive.** In the closed loop (P2, {d['p2'][FIXED]['users']} "
        f"users) an arq job carried {closed.get('items_per_package', 0):.2f} items on average; with open-loop "
        f"arrivals spread evenly (P3) it carried {per_level}. At 50 % of the closed-loop capacity the mean "
        f"`queued_ms` was {over['breakdown'].get('queued_ms', 0):.1f} ms and p99 {over.get('p99_ms', 0):.1f} ms "
        f"(direct single calls: {half['direct'].get('p99_ms', 0):.1f} ms); P6 repeated that load in the same run "
        f"and measured p99 {d.get('p6', {}).get('half_load', {}).get('p99_ms', 0):.1f} ms."
    )


def noop(d: dict[str, Any], cores: int) -> str:
    p6 = d["p6"]
    one = p6.get("one_job_per_request", {})
    text = (
        f"arq's own no-op rate in this run was {p6['noop']['jobs_per_s']:,.0f} jobs/s; coalesced interactive "
        f"requests reached {p6['coalesced_items_per_s']:,.0f} items/s"
    )
    if one:
        text += f", one arq job per request {one['items_per_s']:,.0f}/s"
    api = p6.get("api")
    if api:
        cpu = api.get("cpu_ms_per_item", {})
        total = sum(cpu.values())
        text += (
            f". Through the HTTP API: {api['items_per_s']:,.0f} requests/s, where the API process spent "
            f"{cpu.get('api', 0):.2f} ms of CPU per request and all processes together {total:.2f} ms "
            f"(on {cores} cores: room for ≈ {cores * 1000 / total:,.0f}/s)"
            if total
            else ""
        )
    return text + "."


def overflow(d: dict[str, Any], cores: int) -> str:
    p4 = d["p4"]
    if not p4.get("run"):
        return ""
    on, off = p4["on"], p4["off"]
    text = (
        f"With overflow on, {on['remote_share']:.0%} of the jobs went to the remote and p99 went from "
        f"{off['p99_wait_s']:.1f} s (off) to {on['p99_wait_s']:.1f} s (on)."
    )
    if "local_mean_batch" in on:
        text += (
            f" The jobs kept local ran in Triton batches of {on['local_mean_batch']:.1f} on average "
            f"(off: {off['local_mean_batch']:.1f}) while Triton stayed as busy "
            f"({on['local_busy_fraction']:.0%} vs {off['local_busy_fraction']:.0%} of the time)."
        )
    return text


def idle(d: dict[str, Any], cores: int) -> str:
    w = d["p5"]["worker"]
    used = w.get("idle_cores")
    if not used:
        return ""
    return (
        f"With nothing queued, a started worker used {used.get('worker', 0):.2f} cores and Redis "
        f"{used.get('redis', 0):.2f} over {w['idle_seconds']:.0f} s (each queue is polled every 50 ms; producers wake the worker when they queue work)."
    )


def workers(d: dict[str, Any], cores: int) -> str:
    one, two = d["sweep"]["workers"]
    i1, i2 = one["interactive"]["items_per_s"], two["interactive"]["items_per_s"]
    b1, b2 = one["bulk"]["items_per_s"], two["bulk"]["items_per_s"]
    return (
        f"Two worker processes instead of one on {cores} cores: interactive {i1:,.0f} → {i2:,.0f} items/s "
        f"(×{i2 / i1:.2f}), bulk {b1:,.0f} → {b2:,.0f} (×{b2 / b1:.2f})."
    )


BULLETS: tuple[tuple[tuple[str, ...], Callable[[dict[str, Any], int], str]], ...] = (
    (("p1",), bulk_cpu),
    (("p1",), embed_share),
    (("p2", "p3"), packing),
    (("p6",), noop),
    (("p4",), overflow),
    (("p5",), idle),
    (("sweep",), workers),
)


def section(details: dict[str, Any], cores: int) -> list[str]:
    lines = []
    for needs, bullet in BULLETS:
        if all(n in details for n in needs):
            text = bullet(details, cores)
            if text:
                lines.append(f"- {text}")
    if not lines:
        return []
    return ["## What limits each figure (computed from this run)", "", *lines, ""]
