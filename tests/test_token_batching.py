"""Token-aware batching in the models: an execution's rows run in groups of similar length.

A transformer batch costs its padded size, so the embedding model (and the reranker, which
uses the same encoder) sorts an execution's rows by token count and runs them in groups of
at most ``max_batch_tokens`` padded tokens, then restores the input order.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import numpy as np

from bench.corpus import texts as corpus


def test_runs_cover_every_row_once_sorted_and_within_the_budget(minilm: ModuleType) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(3, 300, size=500).astype(np.int32)
    runs = minilm.length_runs(lengths, 1024)
    rows = np.concatenate(runs)
    assert sorted(rows.tolist()) == list(range(500))
    assert np.all(np.diff(lengths[rows]) >= 0)  # shortest first, run after run
    for run in runs:
        padded = len(run) * int(lengths[run].max())
        assert padded <= 1024 or len(run) == 1  # a row over the budget runs alone
    assert len(runs) < 250  # short rows share runs
    assert [r.tolist() for r in minilm.length_runs(lengths[:5], None)] == [[0, 1, 2, 3, 4]]


def test_grouped_encoding_equals_one_padded_batch_and_is_faster(reference_encoder: Any) -> None:
    texts = corpus(192)  # log-normal lengths: median 26 tokens, a few over 200
    for batch in (texts[:64], texts[64:128], texts[128:]):
        reference_encoder.encode(batch)  # warm up
    timings = {}
    vectors = {}
    for budget in (None, 1024):
        reference_encoder.max_batch_tokens = budget
        started = time.perf_counter()
        out = [reference_encoder.encode(texts[i : i + 64]) for i in range(0, 192, 64)]
        timings[budget] = time.perf_counter() - started
        vectors[budget] = np.concatenate([v for v, _ in out])
        tokens = np.concatenate([t for _, t in out])
    reference_encoder.max_batch_tokens = None
    assert np.abs(vectors[None] - vectors[1024]).max() < 1e-4
    assert tokens.tolist() == reference_encoder.count_tokens(texts).tolist()
    print(f"\n192 mixed-length texts in executions of 64: {timings[None]:.2f} s one padded batch each, "
          f"{timings[1024]:.2f} s in runs of similar length")  # fmt: skip
    assert timings[1024] < timings[None] / 1.5  # measured 3-4.6x on this corpus
