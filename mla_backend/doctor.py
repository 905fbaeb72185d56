"""`python -m mla_backend doctor`: what this machine has and which kernel would serve decode."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import torch
from pydantic import ValidationError

from .config import BackendUnavailableError, MLABackendConfig, flashinfer_available, resolve_backend


def _nvcc_version() -> str:
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = shutil.which("nvcc") or (CUDA_HOME and f"{CUDA_HOME}/bin/nvcc")
    if not nvcc:
        return "not found (the JIT build needs nvcc: set CUDA_HOME)"
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except OSError as err:
        return f"not runnable at {nvcc}: {err}"
    release = [line for line in text.splitlines() if "release" in line]
    return f"{release[-1].strip() if release else text.strip()} ({nvcc})"


def report() -> list[str]:
    lines = [
        f"torch          {torch.__version__} (CUDA {torch.version.cuda})",
        f"nvcc           {_nvcc_version()}",
        f"flashinfer     {'importable' if flashinfer_available() else 'not installed'}",
        f"vllm           {'importable' if importable('vllm') else 'not installed'}",
    ]
    try:
        config = MLABackendConfig.from_sources()
    except (ValidationError, ValueError) as err:
        return lines + [f"config         INVALID: {err}"]
    lines.append(f"config         {config.model_dump()}")
    if not torch.cuda.is_available():
        return lines + ["GPUs           none visible: the op runs the float64 reference on CPU tensors"]
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        capability = config.capability((props.major, props.minor))
        try:
            resolution = resolve_backend(config, capability)
            serves = f"{resolution.kernel}: {resolution.reason}"
        except BackendUnavailableError as err:
            serves = f"ERROR: {err}"
        lines.append(f"GPU {index}          {props.name}, SM {props.major}.{props.minor}, "
                     f"{props.multi_processor_count} SMs -> {serves}")
    return lines


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def main() -> int:
    print("\n".join(report()))
    return 0
