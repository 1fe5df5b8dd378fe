"""Triton Python backend model ``reranker``: bi-encoder cosine relevance.

This is not a cross-encoder: no cross-encoder weights are available offline,
so query and document are embedded separately with all-MiniLM-L6-v2 and
scored by cosine similarity. The encoder is the embedding model's
``minilm.py``, loaded by path (parameter ``encoder_module``, default the
sibling ``embedding/1/minilm.py``), so a real cross-encoder can replace this
file without changing the tensor interface.

Every distinct query and document text in one ``execute`` call is encoded
once; a bad pair gets a per-item ERROR and its batch-mates are unaffected.
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


def decode(item: Any, what: str) -> tuple[str, str]:
    """(text, error) for one TYPE_STRING element."""
    try:
        text = item.decode("utf-8") if isinstance(item, bytes) else str(item)
    except UnicodeDecodeError:
        return "", f"invalid UTF-8 in {what}"
    return (text, "") if text.strip() else ("", f"empty {what}")


def cancelled_response() -> Any:
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError("request cancelled", pb_utils.TritonError.CANCELLED)
    )


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        default = Path(args["model_repository"]).parent / "embedding" / "1" / "minilm.py"
        minilm = load_module("minilm", Path(params.get("encoder_module") or default))
        self.encoder = minilm.MiniLMEncoder(
            onnx_path=params.get("onnx_path") or None,
            tokenizer_path=params.get("tokenizer_path") or None,
            max_seq_length=int(params.get("max_seq_length") or minilm.MAX_SEQ_LENGTH),
            threads=int(params.get("intra_op_num_threads") or 2),
            max_batch_tokens=int(params.get("max_batch_tokens") or 0) or None,
            execution_provider=params.get("execution_provider") or "auto",
        )

    def _encode_unique(self, texts: list[str]) -> dict[str, tuple[np.ndarray, int]]:
        unique = list(dict.fromkeys(texts))
        out: dict[str, tuple[np.ndarray, int]] = {}
        try:
            vectors, tokens = self.encoder.encode(unique)
            out = {t: (v, int(n)) for t, v, n in zip(unique, vectors, tokens, strict=False)}
        except Exception:  # isolate the failing text(s); missing keys become item errors
            for t in unique:
                try:
                    vectors, tokens = self.encoder.encode([t])
                    out[t] = (vectors[0], int(tokens[0]))
                except Exception:
                    pass
        return out

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
        pairs: list[tuple[str, str]] = []
        errors: list[str] = []
        sizes: list[int] = []
        for request in requests:
            queries = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy().reshape(-1)
            documents = pb_utils.get_input_tensor_by_name(request, "DOCUMENT").as_numpy().reshape(-1)
            sizes.append(len(queries))
            for q, d in zip(queries, documents, strict=False):
                (query, q_err), (doc, d_err) = decode(q, "query"), decode(d, "document")
                pairs.append((query, doc))
                errors.append(q_err or d_err)

        good = [i for i, e in enumerate(errors) if not e]
        # Queries and documents are encoded separately so short queries are not padded to long passages.
        q_enc = self._encode_unique([pairs[i][0] for i in good])
        d_enc = self._encode_unique([pairs[i][1] for i in good])

        n = len(pairs)
        scores = np.zeros((n,), np.float32)
        tokens = np.zeros((n,), np.int32)
        for i in good:
            query, doc = pairs[i]
            if query not in q_enc or doc not in d_enc:
                errors[i] = "encoding failed"
                continue
            (qv, qn), (dv, dn) = q_enc[query], d_enc[doc]
            scores[i] = float(np.dot(qv, dv))
            tokens[i] = qn + dn

        responses = []
        start = 0
        for size in sizes:
            part = slice(start, start + size)
            start += size
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("SCORE", scores[part].reshape(-1, 1)),
                        pb_utils.Tensor("TOKENS", tokens[part].reshape(-1, 1)),
                        pb_utils.Tensor("ERROR", np.array(errors[part], dtype=object).reshape(-1, 1)),
                    ]
                )
            )
        return responses

    def finalize(self) -> None:
        self.encoder = None
