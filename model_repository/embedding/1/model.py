"""Triton Python backend model ``embedding``: all-MiniLM-L6-v2 sentence vectors.

All items of all requests in one ``execute`` call are encoded as one batch by
``minilm.MiniLMEncoder`` (next to this file). Bad items get a per-item ERROR
and a zero vector; their batch-mates are unaffected.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode(item: Any) -> tuple[str, str]:
    """(text, error) for one TYPE_STRING element."""
    try:
        text = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError:
        return "", "invalid UTF-8"
    return (text, "") if text.strip() else ("", "empty input")


def cancelled_response() -> Any:
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        minilm = load_module("minilm", Path(args["model_repository"]) / args["model_version"] / "minilm.py")
        self.dim = minilm.DIM
        self.encoder = minilm.MiniLMEncoder(
            onnx_path=params.get("onnx_path") or None,
            tokenizer_path=params.get("tokenizer_path") or None,
            max_seq_length=int(params.get("max_seq_length") or minilm.MAX_SEQ_LENGTH),
            threads=int(params.get("intra_op_num_threads") or 2),
            max_batch_tokens=int(params.get("max_batch_tokens") or 0) or None,
            execution_provider=params.get("execution_provider") or "auto",
        )

    def execute(self, requests: list) -> list:
        # A request whose client hung up or died (a killed worker) is not encoded: Triton still
        # hands queued requests to the model, and the time spent on them would be lost twice
        # (their jobs run again elsewhere).
        gone = [bool(r.is_cancelled()) for r in requests]
        live = iter(self._respond([r for r, g in zip(requests, gone, strict=True) if not g]))
        return [cancelled_response() if g else next(live) for g in gone]

    def _respond(self, requests: list) -> list:
        if not requests:
            return []
        texts: list[str] = []
        errors: list[str] = []
        sizes: list[int] = []
        for request in requests:
            items = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            sizes.append(len(items))
            for text, error in map(decode, items):
                texts.append(text)
                errors.append(error)

        n = len(texts)
        vectors = np.zeros((n, self.dim), np.float32)
        tokens = np.zeros((n,), np.int32)
        good = [i for i in range(n) if not errors[i]]
        try:
            vectors[good], tokens[good] = self.encoder.encode([texts[i] for i in good])
        except Exception:  # isolate the failing item(s): retry one by one
            for i in good:
                try:
                    vectors[i], tokens[i] = (a[0] for a in self.encoder.encode([texts[i]]))
                except Exception as exc:
                    errors[i] = f"encoding failed: {exc}"

        responses = []
        start = 0
        for size in sizes:
            part = slice(start, start + size)
            start += size
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("EMBEDDING", vectors[part]),
                        pb_utils.Tensor("TOKENS", tokens[part].reshape(-1, 1)),
                        pb_utils.Tensor("ERROR", np.array(errors[part], dtype=object).reshape(-1, 1)),
                    ]
                )
            )
        return responses

    def finalize(self) -> None:
        self.encoder = None
