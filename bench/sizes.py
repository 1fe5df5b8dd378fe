"""How big each benchmark is: the full run and the seconds-size smoke run."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Sizes:
    reps: int = 3  # repetitions per figure; the median is reported
    bulk_items_fixed: int = 12_000  # P1 on the fixed-cost model
    bulk_items_embed: int = 1_500  # P1 on the real embedding model (≈ 370 items/s here)
    direct_probe_items: int = 3_000  # items per concurrency probe of the direct batched limit
    interactive_items: int = 4_000  # P2 closed loop, fixed-cost model
    interactive_items_embed: int = 1_200
    users: int = 256  # P2 concurrent submit+wait loops
    naive_seconds: float = 3.0  # P2 naive sequential calls
    latency_seconds: float = 6.0  # P3 per load level
    latency_levels: tuple[float, ...] = (0.1, 0.5, 0.9)
    redis_jobs: int = 100_000  # P5 queued jobs
    rss_jobs: int = 100_000  # P5 jobs a worker processes between its two RSS readings
    idle_seconds: float = 3.0  # P5 CPU of an idle worker and Redis
    sweep_waits_ms: tuple[float, ...] = (0.5, 2.0, 8.0)
    sweep_batches: tuple[int, ...] = (16, 64)
    sweep_items: int = 3_000
    noop_jobs: int = 6_000  # P6 arq no-op jobs
    overflow_seconds: float = 6.0  # P4 offered load duration
    overflow_exec_ms: float = 1000.0  # P4's slowed model: a local capacity of 64 items/s
    timeout_s: float = 120.0  # bound on any single measured phase

    def smoke(self) -> Sizes:
        return replace(
            self,
            reps=1,
            bulk_items_fixed=1_000,
            bulk_items_embed=128,
            direct_probe_items=192,
            interactive_items=600,
            interactive_items_embed=100,
            users=64,
            naive_seconds=0.5,
            latency_seconds=1.0,
            latency_levels=(0.5,),
            redis_jobs=20_000,
            rss_jobs=2_000,
            idle_seconds=1.0,
            sweep_waits_ms=(2.0,),
            sweep_batches=(64,),
            sweep_items=300,
            noop_jobs=500,
            overflow_seconds=1.0,
            overflow_exec_ms=250.0,  # the same shape in a quarter of the time
            timeout_s=30.0,
        )


FULL = Sizes()
SMOKE = FULL.smoke()
