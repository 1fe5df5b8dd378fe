"""Triton Python backend model ``chat``: SmolLM2-135M-Instruct on llama.cpp via cyllama.

Each item is an OpenAI-style message list (MESSAGES, JSON) with sampling
parameters (PARAMS, JSON: max_tokens, temperature, top_p, seed, stop). Items
of all requests in one ``execute`` call are generated together by
``smollm.ChatEngine`` (next to this file); each has its own sampler, so mixed
parameters still share a batch. Invalid items get a per-item ERROR.
"""

from __future__ import annotations

import importlib.util
import json
import sys
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


class TritonPythonModel:
    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.smollm = load_module(
            "smollm", Path(args["model_repository"]) / args["model_version"] / "smollm.py"
        )
        self.max_tokens = int(params.get("max_tokens") or 256)
        self.engine = self.smollm.ChatEngine(
            model_path=params.get("model_path") or None,
            n_ctx=int(params.get("n_ctx") or 2048),
            n_seq_max=max(int(config.get("max_batch_size") or 8), 1),
            threads=int(params.get("n_threads") or 2),
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

    def _generate(self, prompts: list[list[int]], sampling: list[Any]) -> list[Any]:
        try:
            return self.engine.generate(prompts, sampling)
        except Exception:  # isolate the failing item(s)
            results = []
            for p, s in zip(prompts, sampling, strict=False):
                try:
                    results.append(self.engine.generate([p], [s])[0])
                except Exception as exc:
                    results.append(exc)
            return results

    def execute(self, requests: list) -> list:
        n_items: list[int] = []
        rows: list[dict[str, Any]] = []
        for request in requests:
            messages = pb_utils.get_input_tensor_by_name(request, "MESSAGES").as_numpy().reshape(-1)
            params = pb_utils.get_input_tensor_by_name(request, "PARAMS").as_numpy().reshape(-1)
            n_items.append(len(messages))
            for m, p in zip(messages, params, strict=False):
                row: dict[str, Any] = {"text": "", "finish": "", "prompt": 0, "completion": 0, "error": ""}
                try:
                    row["tokens"], row["sampling"] = self._prepare(m, p)
                except Exception as exc:
                    row["error"] = str(exc)
                rows.append(row)

        todo = [r for r in rows if not r["error"]]
        for row, result in zip(
            todo, self._generate([r["tokens"] for r in todo], [r["sampling"] for r in todo]), strict=False
        ):
            if isinstance(result, Exception):
                row["error"] = f"generation failed: {result}"
            else:
                row.update(
                    text=result.text,
                    finish=result.finish_reason,
                    prompt=result.prompt_tokens,
                    completion=result.completion_tokens,
                )

        responses = []
        start = 0
        for size in n_items:
            part = rows[start : start + size]
            start += size

            def column(key: str, dtype: Any, part: list[dict[str, Any]] = part) -> np.ndarray:
                return np.array([r[key] for r in part], dtype=dtype).reshape(-1, 1)

            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("TEXT", column("text", object)),
                        pb_utils.Tensor("FINISH_REASON", column("finish", object)),
                        pb_utils.Tensor("PROMPT_TOKENS", column("prompt", np.int32)),
                        pb_utils.Tensor("COMPLETION_TOKENS", column("completion", np.int32)),
                        pb_utils.Tensor("ERROR", column("error", object)),
                    ]
                )
            )
        return responses

    def finalize(self) -> None:
        self.engine = None
