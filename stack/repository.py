"""The model repository for a device: ``model_repository/`` as shipped (CPU), or its GPU variant.

One setting picks it (``OVERSPILL_TRITON_DEVICE``, ``cpu`` or ``gpu``); nobody edits a
``config.pbtxt`` by hand. The GPU variant is a copy in which every model that takes an
``execution_provider`` parameter (the onnxruntime models: embedding, reranker) gets
``instance_group`` ``KIND_GPU``, ``execution_provider`` ``cuda`` and a GPU-sized
``max_batch_tokens``; the others (the chat model,
the fixed-cost benchmark model) stay as they are.

Standard library only, so the Triton image runs this file as a script at build time::

    python3 repository.py --device gpu SOURCE DEST
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

DEVICES = ("cpu", "gpu")
_PROVIDER = re.compile(r'(key:\s*"execution_provider",\s*value:\s*\{\s*string_value:\s*)"[a-z]*"')
_TOKENS = re.compile(r'(key:\s*"max_batch_tokens",\s*value:\s*\{\s*string_value:\s*)"\d*"')
# A GPU runs big batches best: the CPU's small groups (512 tokens) would starve it. 64 rows of
# 256 tokens: MiniLM's whole batch in one run.
GPU_MAX_BATCH_TOKENS = 16384


def gpu_config(text: str) -> str:
    """A ``config.pbtxt`` for the GPU: unchanged unless the model takes ``execution_provider``."""
    if not _PROVIDER.search(text):
        return text
    text = _PROVIDER.sub(r'\1"cuda"', text)
    text = _TOKENS.sub(rf'\1"{GPU_MAX_BATCH_TOKENS}"', text)
    return re.sub(r"\bKIND_CPU\b", "KIND_GPU", text)


def repository_for(device: str, source: Path, dest: Path) -> Path:
    """The repository to serve on ``device``: ``source`` itself for the CPU, else the GPU
    variant written (afresh) to ``dest``."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, not {device!r}")
    if device == "cpu":
        return source
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
    for config in dest.glob("*/config.pbtxt"):
        config.write_text(gpu_config(config.read_text()))
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=DEVICES, required=True)
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args()
    served = repository_for(args.device, args.source, args.dest)
    if served != args.dest:  # the CPU repository is the source itself: copy it as it is
        shutil.copytree(served, args.dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    print(f"{args.device} model repository in {args.dest}")


if __name__ == "__main__":
    main()
