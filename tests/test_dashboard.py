"""The Grafana dashboard only charts metrics the code really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

import producer.api  # noqa: F401  # registers the API's metrics
import workers.core.metrics  # noqa: F401

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "overspill.json"


def exported_names() -> set[str]:
    names: set[str] = set()
    for collector in REGISTRY.collect():
        names.add(collector.name)
        names.update(sample.name for sample in collector.samples)
    return names


def test_every_overspill_metric_on_the_dashboard_is_exported() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(overspill_[a-z_]+)", e)}
    exported = exported_names()
    # Histogram series (_bucket/_sum/_count) appear once observed; their family names are registered.
    base = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in exported}
    missing = {
        m for m in used if m not in exported and re.sub(r"_(bucket|sum|count|total)$", "", m) not in base
    }
    assert not missing, f"dashboard charts metrics nobody exports: {sorted(missing)}"
    assert {"overspill_queue_depth", "overspill_jobs_total", "overspill_webhook_deliveries_total"} <= used


def test_it_covers_what_operators_need() -> None:
    titles = " ".join(p["title"].lower() for p in json.loads(DASHBOARD.read_text())["panels"])
    for topic in ("queue depth", "batch size", "latency", "remote", "circuit", "webhook", "triton"):
        assert topic in titles
