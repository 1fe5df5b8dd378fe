"""Worker metrics: a package's values observed at once land exactly where one by one would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from workers.core import observe_many


def samples(histogram: Histogram) -> dict[str, float]:
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for metric in histogram.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    }


def test_observe_many_matches_observe_one_by_one() -> None:
    registry = CollectorRegistry()
    buckets = (1, 2, 5, 10, 50)
    one = Histogram("one_ms", "", buckets=buckets, registry=registry)
    many = Histogram("many_ms", "", buckets=buckets, registry=registry)
    values = [0.0, 1.0, 1.5, 2.0, 4.9, 5.0, 5.1, 49.0, 50.0, 51.0, 1e6]
    for v in values:
        one.observe(v)
    observe_many(many, values)
    expected = {k.replace("one_ms", "many_ms"): v for k, v in samples(one).items()}
    assert samples(many) == expected
