"""A mixed-length text corpus, as real chunked documents are: lengths log-normal, deterministic.

Word counts are log-normal around 22 words (about 30 MiniLM tokens; the 90th percentile near
80 tokens, the longest capped at 180 words, over 200 tokens), the words drawn from a fixed
vocabulary, so every run and every machine embeds the same texts.
"""

from __future__ import annotations

import random

VOCABULARY = (
    "river glacier compiler violin market comet bakery harbour lantern orchard meadow canyon "
    "archive beacon cathedral delta ember fjord granite horizon island jasmine kernel lagoon "
    "monsoon nebula oasis prairie quartz reef savanna tundra umbrella valley willow zenith "
    "algorithm bandwidth cache database encryption firmware gateway hashing interface latency "
    "migration network operator protocol query register scheduler throughput vector workload"
).split()
MEDIAN_WORDS = 22
SIGMA = 0.8
MAX_WORDS = 180


def texts(n: int, seed: int = 7) -> list[str]:
    """``n`` texts of log-normal length, the same for the same ``n`` and ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = min(MAX_WORDS, max(1, round(rng.lognormvariate(0.0, SIGMA) * MEDIAN_WORDS)))
        out.append(f"{i} " + " ".join(rng.choice(VOCABULARY) for _ in range(words)))
    return out
