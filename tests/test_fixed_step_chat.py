"""The chat model's scheduler on the fixed-step engine (GPU-like: a decode step costs the same
for any batch up to the slots, and joining prompts are decoded in it): continuous batching
keeps the slots full, static batching waits for each batch's longest conversation, and both
give every conversation the same tokens.

In process, no Triton: the scheduler and the engine are the files Triton loads.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from stack.processes import MODEL_REPOSITORY

SLOTS, STEP_MS = 4, 5.0
BUDGETS = [4, 40, 8, 36, 6, 40, 10, 32, 5, 38, 7, 34, 9, 30, 4, 40]  # mixed, as chat traffic is


def load(name: str) -> ModuleType:
    path = MODEL_REPOSITORY / "chat" / "1" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", Path(path))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


class Sink:
    def __init__(self) -> None:
        self.text = ""
        self.completion: Any = None
        self.finished = threading.Event()

    def delta(self, text: str) -> None:
        self.text += text

    def finish(self, tail: str, completion: Any) -> None:
        self.text += tail
        self.completion = completion
        self.finished.set()

    def fail(self, message: str) -> None:
        raise AssertionError(message)

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> None:
        raise AssertionError("not cancelled")


@pytest.fixture(scope="module")
def modules() -> tuple[ModuleType, ModuleType]:
    return load("smollm"), load("fixedstep")


def run(modules: tuple[ModuleType, ModuleType], scheduling: str) -> tuple[float, list[Sink], int]:
    smollm, fixedstep = modules
    engine = fixedstep.FixedStepEngine(step_ms=STEP_MS, n_seq_max=SLOTS)
    scheduler = smollm.Scheduler(engine, scheduling)
    sinks = [Sink() for _ in BUDGETS]
    started = time.perf_counter()
    try:
        for sink, budget in zip(sinks, BUDGETS, strict=True):
            scheduler.submit(engine.tokenize("a question"), smollm.Sampling(max_tokens=budget), sink)
        for sink in sinks:
            assert sink.finished.wait(30), "a conversation never finished"
    finally:
        scheduler.close()
    # Prompts are decoded in the step they join (fused_prefill): every decode call is a step.
    assert engine.ctx.calls == scheduler.steps
    return time.perf_counter() - started, sinks, scheduler.steps


def test_every_conversation_gets_its_own_budget_of_deterministic_tokens(modules: Any) -> None:
    _, sinks, _ = run(modules, "continuous")
    words = modules[1].WORDS
    for sink, budget in zip(sinks, BUDGETS, strict=True):
        assert sink.completion.completion_tokens == budget and sink.completion.finish_reason == "length"
        assert sink.text.split() == [words[i % len(words)] for i in range(budget)]


def test_continuous_batching_takes_fewer_steps_than_static_for_the_same_tokens(modules: Any) -> None:
    continuous_s, continuous, steps_c = run(modules, "continuous")
    static_s, static, steps_s = run(modules, "static")
    assert [s.text for s in continuous] == [s.text for s in static]
    # Static: each batch of 4 runs as long as its longest; continuous refills a slot as it frees.
    ideal = -(-sum(BUDGETS) // SLOTS)  # every slot busy on every step
    assert steps_c <= ideal + max(BUDGETS)
    assert steps_s >= 1.4 * steps_c, (steps_s, steps_c)
    assert static_s > continuous_s  # loose: the clock follows the steps
