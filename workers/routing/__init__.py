"""Where a job should run: the router's decision, the live policy, and the load signals it reads."""

from .policy import PolicyConfig, PolicyWatcher, merged, worker_id
from .router import Health, Hysteresis, JobView, OverloadGate, Router, RouterConfig
from .signals import (
    LocalLoad,
    ModelCounters,
    Sampler,
    Snapshot,
    gpu_utilization,
    model_counters,
    parse_metrics,
    queue_ms_per_exec,
)

__all__ = (
    "Health",
    "Hysteresis",
    "JobView",
    "LocalLoad",
    "ModelCounters",
    "OverloadGate",
    "PolicyConfig",
    "PolicyWatcher",
    "Router",
    "RouterConfig",
    "Sampler",
    "Snapshot",
    "gpu_utilization",
    "merged",
    "model_counters",
    "parse_metrics",
    "queue_ms_per_exec",
    "worker_id",
)
