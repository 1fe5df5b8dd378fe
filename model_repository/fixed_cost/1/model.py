"""Triton Python backend model ``fixed_cost``: a benchmark and test model.

It stands for a GPU kernel with a fixed cost per execution: every ``execute``
call sleeps ``exec_ms`` milliseconds whatever its batch size. It is NOT an
embedding model: EMBEDDING is a deterministic unit vector derived from a hash
of the text, and TOKENS is the whitespace word count plus 2 ([CLS]/[SEP]).

Test hooks: the item text ``__poison__`` gets ERROR "poisoned input" (that item
only); ``__crash__`` fails its whole request with an error (other requests in
the same execution are unaffected). The sleep can be changed at run time by
writing a number of milliseconds into the file named by ``exec_ms_file``
(or by ``$FIXED_COST_MS_FILE``; re-read at most every 0.5 s; if the file is missing
or invalid, ``exec_ms``).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

DIM = 384
RELOAD_S = 0.5


def fake_embeddings(texts: list[str]) -> np.ndarray:
    """Unit vectors from the texts' SHAKE-256 streams (int16 components): a hash and a cast per text.

    Cheap on purpose: the model's cost must be its fixed sleep, not the vectors it makes.
    ``stack/fake_remote.py`` computes the same vectors, so spilled results equal these.
    """
    raw = b"".join(hashlib.shake_256(t.encode("utf-8")).digest(2 * DIM) for t in texts)
    v = np.frombuffer(raw, dtype="<i2").reshape(len(texts), DIM).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def decode(item: Any) -> tuple[str, str]:
    try:
        text = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError:
        return "", "invalid UTF-8"
    if not text.strip():
        return "", "empty input"
    if text == "__poison__":
        return "", "poisoned input"
    return text, ""


def cancelled_response() -> Any:
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.default_ms = float(params.get("exec_ms") or 5)
        # The environment variable lets a test or benchmark point every server at its own file.
        ms_file = params.get("exec_ms_file") or os.environ.get("FIXED_COST_MS_FILE", "")
        self.ms_file = Path(ms_file) if ms_file else None
        self.ms = self.default_ms
        self.checked = float("-inf")

    def _exec_ms(self) -> float:
        now = time.monotonic()
        if self.ms_file is not None and now - self.checked >= RELOAD_S:
            self.checked = now
            try:
                self.ms = float(self.ms_file.read_text().strip())
            except (OSError, ValueError):
                self.ms = self.default_ms
        return self.ms

    def _respond(self, request: Any) -> Any:
        items = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
        decoded = [decode(item) for item in items]
        if any(text == "__crash__" for text, _ in decoded):
            raise RuntimeError("crash requested by __crash__ input")
        ok = [i for i, (_, error) in enumerate(decoded) if not error]
        vectors = np.zeros((len(items), DIM), np.float32)
        tokens = np.zeros((len(items), 1), np.int32)
        if ok:
            vectors[ok] = fake_embeddings([decoded[i][0] for i in ok])
        for i in ok:
            tokens[i] = len(decoded[i][0].split()) + 2
        errors = np.array([e for _, e in decoded], dtype=object).reshape(-1, 1)
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("EMBEDDING", vectors),
                pb_utils.Tensor("TOKENS", tokens),
                pb_utils.Tensor("ERROR", errors),
            ]
        )

    def execute(self, requests: list) -> list:
        # A request whose client hung up or died (a killed worker) is not worked on: Triton
        # still hands queued requests to the model, and the time spent on them is lost twice
        # (their jobs run again elsewhere). No live request, no kernel to wait for.
        cancelled = [bool(r.is_cancelled()) for r in requests]
        if not all(cancelled):
            time.sleep(max(self._exec_ms(), 0.0) / 1000.0)
        responses = []
        for request, gone in zip(requests, cancelled, strict=True):
            if gone:
                responses.append(cancelled_response())
                continue
            try:
                responses.append(self._respond(request))
            except Exception as exc:  # request-wide failure: this request only
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(exc))))
        return responses

    def finalize(self) -> None:
        pass
