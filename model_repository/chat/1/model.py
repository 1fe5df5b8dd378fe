"""Triton Python backend model ``chat``: SmolLM2-135M-Instruct on llama.cpp via cyllama.

Decoupled: one request is one conversation, an OpenAI-style message list (MESSAGES, JSON) with
sampling parameters (PARAMS, JSON: max_tokens, temperature, top_p, seed, stop), and it gets a
stream of responses. Each response's TEXT is the new text since the previous one; the last
one, flagged COMPLETE_FINAL, also carries FINISH_REASON, PROMPT_TOKENS and COMPLETION_TOKENS.
A conversation the model rejects gets one final response with ERROR set (its neighbours are
unaffected). ``execute`` only validates and queues: ``smollm.Scheduler`` (next to this file)
decodes every running conversation together on its own thread, admitting new ones between
decode steps (parameter ``scheduling``: ``continuous``, or ``static`` to admit only into an
empty batch). A client that cancels its call stops its sequence within one decode step.

Model metrics: ``chat_busy_slots``, sequences holding a slot (of ``n_seq_max``), and
``chat_decode_steps``, decode calls made.
"""

from __future__ import annotations

import importlib.util
import json
import queue
import sys
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

ROLES = {"system", "user", "assistant"}


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def parse_messages(raw: bytes) -> list[dict[str, str]]:
    messages = json.loads(raw.decode("utf-8"))
    if not isinstance(messages, list) or not messages:
        raise ValueError("MESSAGES must be a non-empty JSON array")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"message {i}: role must be one of system, user, assistant")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i}: content must be a string")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def parse_params(raw: bytes, cap: int, sampling_cls: type) -> Any:
    text = raw.decode("utf-8").strip()
    p = json.loads(text) if text else {}
    if not isinstance(p, dict):
        raise ValueError("PARAMS must be a JSON object")

    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    max_tokens = p.get("max_tokens", cap)
    if max_tokens is None:
        max_tokens = cap
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError("max_tokens must be a positive integer")
    temperature = p.get("temperature", 0.0)
    temperature = 0.0 if temperature is None else temperature
    if not number(temperature) or not 0.0 <= temperature <= 2.0:
        raise ValueError("temperature must be a number in [0, 2]")
    top_p = p.get("top_p", 1.0)
    top_p = 1.0 if top_p is None else top_p
    if not number(top_p) or not 0.0 < top_p <= 1.0:
        raise ValueError("top_p must be a number in (0, 1]")
    seed = p.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        raise ValueError("seed must be an integer or null")
    stop = p.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ValueError("stop must be a list of strings or null")
    return sampling_cls(min(max_tokens, cap), float(temperature), float(top_p), seed, stop)


OUTPUTS = ("TEXT", "FINISH_REASON", "PROMPT_TOKENS", "COMPLETION_TOKENS", "ERROR")


def response(text: str = "", finish: str = "", prompt: int = 0, completion: int = 0, error: str = "") -> Any:
    def column(value: Any, dtype: Any) -> np.ndarray:
        return np.array([value], dtype=dtype).reshape(1, 1)

    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("TEXT", column(text.encode(), object)),
            pb_utils.Tensor("FINISH_REASON", column(finish.encode(), object)),
            pb_utils.Tensor("PROMPT_TOKENS", column(prompt, np.int32)),
            pb_utils.Tensor("COMPLETION_TOKENS", column(completion, np.int32)),
            pb_utils.Tensor("ERROR", column(error.encode(), object)),
        ]
    )


class Outbox:
    """Sends every conversation's responses from a thread of its own.

    A send (and an ``is_cancelled`` check) is a round trip to the Triton process; made from
    the decode loop, 8 sequences' worth per step cost more than the step itself. Here the
    deltas of one conversation still queued are merged into one response, and the cancel
    state of every open conversation is refreshed between rounds (at least every
    ``poll_s``), for the decode loop to read without a round trip.
    """

    def __init__(self, poll_s: float = 0.01) -> None:
        self.poll_s = poll_s
        self._queue: queue.SimpleQueue[tuple[Responder, str, Any] | None] = queue.SimpleQueue()
        self._open: set[Responder] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="chat-outbox", daemon=True)
        self._thread.start()

    def open(self, responder: Responder) -> None:
        with self._lock:
            self._open.add(responder)

    def put(self, responder: Responder, kind: str, payload: Any = None) -> None:
        self._queue.put((responder, kind, payload))

    def close(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            try:
                items = [self._queue.get(timeout=self.poll_s)]
            except queue.Empty:
                items = []
            while True:  # everything queued meanwhile goes in this round
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            if None in items:
                items = items[: items.index(None)]
                self._send(items)
                return
            self._send(items)
            self._poll()

    def _send(self, items: list[tuple[Responder, str, Any]]) -> None:
        merged: dict[Responder, list[Any]] = {}  # responder -> [text, last kind, payload]
        for responder, kind, payload in items:
            entry = merged.setdefault(responder, ["", "delta", None])
            if kind == "delta":
                entry[0] += payload
            else:
                entry[1], entry[2] = kind, payload
        for responder, (text, kind, payload) in merged.items():
            try:
                responder.send(text, kind, payload)
            except Exception as exc:  # its caller is gone; the others still get theirs
                pb_utils.Logger.log_warn(f"chat: a response could not be sent: {exc}")
            if kind != "delta":
                with self._lock:
                    self._open.discard(responder)

    def _poll(self) -> None:
        with self._lock:
            open_ = [r for r in self._open if not r.is_cancelled]
        for responder in open_:
            try:
                responder.is_cancelled = bool(responder.sender.is_cancelled())
            except Exception:
                responder.is_cancelled = True


class Responder:
    """One conversation's response stream (a ``smollm.Sink``), sent through the outbox."""

    def __init__(self, request: Any, outbox: Outbox) -> None:
        self.sender = request.get_response_sender()
        self.outbox = outbox
        self.is_cancelled = False  # refreshed by the outbox
        outbox.open(self)

    def delta(self, text: str) -> None:
        self.outbox.put(self, "delta", text)

    def finish(self, tail: str, completion: Any) -> None:
        self.outbox.put(self, "delta", tail)
        self.outbox.put(self, "finish", completion)

    def fail(self, message: str) -> None:
        self.outbox.put(self, "fail", message)

    def cancelled(self) -> bool:
        return self.is_cancelled

    def cancel(self) -> None:
        self.outbox.put(self, "cancel")

    def send(self, text: str, kind: str, payload: Any) -> None:
        """One response: a delta, or the final one (``finish``, ``fail``, ``cancel``)."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if kind == "delta":
            self.sender.send(response(text))
        elif kind == "finish":
            c = payload
            self.sender.send(
                response(text, c.finish_reason, c.prompt_tokens, c.completion_tokens), flags=final
            )
        elif kind == "fail":
            self.sender.send(response(error=payload), flags=final)
        else:  # cancelled: nobody reads the text any more
            self.sender.send(flags=final)


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("model 'chat' needs model_transaction_policy decoupled")
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.smollm = load_module(
            "smollm", Path(args["model_repository"]) / args["model_version"] / "smollm.py"
        )
        self.max_tokens = int(params.get("max_tokens") or 256)
        n_ctx, n_seq_max = int(params.get("n_ctx") or 2048), max(int(params.get("n_seq_max") or 8), 1)
        if (params.get("engine") or "smollm") == "fixed_step":
            # GPU-like costs for the same scheduler: a decode step takes step_ms for any batch.
            fixed = load_module(
                "fixedstep", Path(args["model_repository"]) / args["model_version"] / "fixedstep.py"
            )
            step_ms = float(params.get("step_ms") or 20)
            self.engine = fixed.FixedStepEngine(step_ms=step_ms, n_ctx=n_ctx, n_seq_max=n_seq_max)
        else:
            self.engine = self.smollm.ChatEngine(
                model_path=params.get("model_path") or None,
                n_ctx=n_ctx,
                n_seq_max=n_seq_max,
                threads=int(params.get("n_threads") or 2),
            )
        self.outbox = Outbox()
        labels = {"model": args["model_name"]}
        self.metric_families = [  # must outlive their metrics
            pb_utils.MetricFamily(
                name="chat_busy_slots",
                description="Sequences holding a decode slot",
                kind=pb_utils.MetricFamily.GAUGE,
            ),
            pb_utils.MetricFamily(
                name="chat_decode_steps",
                description="Decode calls made (each advances every running sequence by a token)",
                kind=pb_utils.MetricFamily.COUNTER,
            ),
        ]
        busy, steps = (family.Metric(labels=labels) for family in self.metric_families)
        self.scheduler = self.smollm.Scheduler(
            self.engine,
            params.get("scheduling") or "continuous",
            on_occupancy=busy.set,
            on_step=lambda: steps.increment(1),
        )

    def _prepare(self, raw_messages: bytes, raw_params: bytes) -> tuple[list[int], Any]:
        try:
            messages = parse_messages(raw_messages)
        except (ValueError, UnicodeDecodeError) as exc:  # json.JSONDecodeError is a ValueError
            raise ValueError(f"invalid MESSAGES: {exc}") from None
        try:
            sampling = parse_params(raw_params, self.max_tokens, self.smollm.Sampling)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ValueError(f"invalid PARAMS: {exc}") from None
        tokens = self.engine.tokenize(self.engine.render(messages))
        if len(tokens) >= self.engine.n_ctx:
            raise ValueError(f"prompt too long: {len(tokens)} tokens, context is {self.engine.n_ctx}")
        return tokens, sampling

    def execute(self, requests: list) -> None:
        for request in requests:
            sink = Responder(request, self.outbox)
            try:
                messages = pb_utils.get_input_tensor_by_name(request, "MESSAGES").as_numpy().reshape(-1)
                params = pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy().reshape(-1)
                if len(messages) != 1 or len(params) != 1:
                    raise ValueError("one conversation per request: MESSAGES and PARAMS of shape [1, 1]")
                tokens, sampling = self._prepare(messages[0], params[0])
            except Exception as exc:
                sink.fail(str(exc))
                continue
            self.scheduler.submit(tokens, sampling, sink)
        return None

    def finalize(self) -> None:
        self.scheduler.close()
        self.outbox.close()
        self.engine = None
