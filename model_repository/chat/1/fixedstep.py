"""A stand-in for the chat engine whose decode step costs a fixed time for up to ``n_seq_max``
running sequences, as memory-bound decoding on a GPU does; no llama.cpp, no weights.

On this project's CPU machines SmolLM2 is compute-bound (a step of 8 sequences costs several
times a step of one), so no scheduler can show there what continuous batching buys. This
engine lets the chat model's own :class:`smollm.Scheduler` run against GPU-like costs: the
config parameter ``engine: fixed_step`` (with ``step_ms``) swaps it in. Tokens are
deterministic: position ``i`` of any conversation is word ``i % len(WORDS)``, and a
conversation always runs to its ``max_tokens`` (finish ``length``), never to an end token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

WORDS = ("lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit")


@dataclass
class Batch:
    """What the scheduler fills for one decode call: only its size matters here."""

    tokens: list[int] = field(default_factory=list)

    def clear(self) -> None:
        self.tokens.clear()

    def add(self, token: int, pos: int, seq_ids: list[int], logits: bool) -> None:
        self.tokens.append(token)


class Context:
    """``decode`` sleeps ``step_s`` whatever the batch holds, up to the engine's slots."""

    def __init__(self, step_s: float, slots: int) -> None:
        self.step_s = step_s
        self.slots = slots
        self.calls = 0

    def decode(self, batch: Batch) -> None:
        self.calls += 1
        time.sleep(self.step_s)


class Vocab:
    def is_eog(self, token: int) -> bool:
        return False  # conversations end at their token budget


class Sampler:
    """The next token of one conversation: its position, as a word index."""

    def __init__(self) -> None:
        self.position = 0

    def sample(self, ctx: Context, index: int) -> int:
        token = self.position % len(WORDS)
        self.position += 1
        return token


class FixedStepEngine:
    """The parts of :class:`smollm.ChatEngine` the scheduler uses, at a fixed cost per step."""

    # Prompts joining a step are decoded in the same call, as GPU servers do (chunked prefill):
    # on a GPU the call costs a step whatever it holds. (llama.cpp on CPU decodes them apart.)
    fused_prefill = True

    def __init__(
        self, step_ms: float = 20.0, n_ctx: int = 2048, n_seq_max: int = 8, n_batch: int = 512
    ) -> None:
        self.n_ctx, self.n_seq_max, self.n_batch = n_ctx, n_seq_max, max(n_batch, n_seq_max)
        self.ctx = Context(step_ms / 1000.0, n_seq_max)
        self.batch = Batch()
        self.vocab = Vocab()

    def new_batch(self) -> Batch:
        return Batch()

    def render(self, messages: list[dict[str, str]]) -> str:
        return json.dumps(messages)

    def tokenize(self, text: str) -> list[int]:
        return [0] * (len(text) // 4 + 1)  # about a token per 4 characters, as real tokenizers

    def detokenize(self, ids: list[int]) -> str:
        return "".join(f"{WORDS[i]} " for i in ids)

    def sampler(self, sampling: Any) -> Sampler:
        return Sampler()

    def release(self, slot: int) -> None:
        pass

    def reset(self) -> None:
        pass
