"""Load signals read from Triton's Prometheus endpoint (sampled in the background)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+([-+0-9.eE]+|NaN|[+-]Inf)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format → (name, labels, value) samples."""
    samples = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(3) or ""))
            samples.append((m.group(1), labels, float(m.group(4))))
    return samples


@dataclass(slots=True)
class ModelCounters:
    """Cumulative per-model counters from Triton (sum over versions)."""

    requests: float = 0.0  # nv_inference_request_success
    inferences: float = 0.0  # nv_inference_count: items
    executions: float = 0.0  # nv_inference_exec_count: batches the model ran
    queue_us: float = 0.0  # nv_inference_queue_duration_us
    pending: float = 0.0  # nv_inference_pending_request_count (a gauge)

    @property
    def mean_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0


_FIELDS = {
    "nv_inference_request_success": "requests",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_pending_request_count": "pending",
}


def model_counters(text: str) -> dict[str, ModelCounters]:
    out: dict[str, ModelCounters] = {}
    for name, labels, value in parse_metrics(text):
        field = _FIELDS.get(name)
        if field and "model" in labels:
            counters = out.setdefault(labels["model"], ModelCounters())
            setattr(counters, field, getattr(counters, field) + value)
    return out
