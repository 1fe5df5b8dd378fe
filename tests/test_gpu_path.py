"""The GPU path without code edits: one setting picks the repository, the models pick the provider.

No GPU here, so what is shown is the selection: the CPU fallback on this machine (in Triton's
own log), the choice on a GPU host, the refusal of ``cuda`` without CUDA, and the GPU variant
of the repository that ``OVERSPILL_TRITON_DEVICE=gpu`` and the Triton image serve.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from stack.processes import MODEL_REPOSITORY
from stack.repository import GPU_MAX_BATCH_TOKENS, repository_for

from .conftest import Triton

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


def test_auto_runs_on_the_gpu_only_where_onnxruntime_has_cuda_and_a_gpu_is_visible(
    minilm: ModuleType,
) -> None:
    assert minilm.providers_for("auto", [CUDA, CPU], gpu=True)[0] == [CUDA, CPU]
    providers, note = minilm.providers_for("auto", [CUDA, CPU], gpu=False)
    assert providers == [CPU] and "no GPU visible" in note
    providers, note = minilm.providers_for("auto", [CPU], gpu=True)
    assert providers == [CPU] and "no CUDA provider" in note
    assert minilm.providers_for("cpu", [CUDA, CPU], gpu=True)[0] == [CPU]


def test_cuda_without_cuda_is_an_error_not_a_silent_cpu(minilm: ModuleType) -> None:
    with pytest.raises(RuntimeError, match="onnxruntime-gpu"):
        minilm.providers_for("cuda", [CPU], gpu=True)
    with pytest.raises(ValueError, match="execution_provider"):
        minilm.providers_for("tpu", [CPU], gpu=True)


def test_this_machine_falls_back_to_the_cpu_and_says_so_in_tritons_log(triton: Triton) -> None:
    log = Path(triton.process.log_path).read_text(errors="replace")
    assert "execution_provider auto: on the CPU" in log


def test_the_gpu_variant_changes_only_the_onnxruntime_models(tmp_path: Path) -> None:
    assert repository_for("cpu", MODEL_REPOSITORY, tmp_path / "unused") == MODEL_REPOSITORY
    gpu = repository_for("gpu", MODEL_REPOSITORY, tmp_path / "gpu")
    for model in ("embedding", "reranker"):
        config = (gpu / model / "config.pbtxt").read_text()
        assert "KIND_GPU" in config and "KIND_CPU" not in config
        assert 'key: "execution_provider", value: { string_value: "cuda" }' in config
        assert f'key: "max_batch_tokens", value: {{ string_value: "{GPU_MAX_BATCH_TOKENS}" }}' in config
    for model in ("chat", "fixed_cost"):
        assert (gpu / model / "config.pbtxt").read_text() == (
            MODEL_REPOSITORY / model / "config.pbtxt"
        ).read_text()
    assert (gpu / "embedding" / "1" / "minilm.py").exists()  # the reranker loads its sibling's encoder
    with pytest.raises(ValueError, match="device"):
        repository_for("tpu", MODEL_REPOSITORY, tmp_path / "x")


def test_the_triton_image_builds_it_with_the_same_file_run_as_a_script(tmp_path: Path) -> None:
    """deploy/triton/Dockerfile runs stack/repository.py with the image's python3: it must need
    nothing but the standard library."""
    script = Path(__file__).resolve().parent.parent / "stack" / "repository.py"
    out = subprocess.run(
        [sys.executable, "-I", str(script), "--device", "gpu", str(MODEL_REPOSITORY), str(tmp_path / "m")],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    assert "gpu model repository" in out.stdout
    assert "KIND_GPU" in (tmp_path / "m" / "embedding" / "config.pbtxt").read_text()
