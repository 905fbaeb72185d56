"""`python -m mla_backend doctor`: what this machine has and which kernel would serve decode."""

from __future__ import annotations

import importlib.util

import torch
from pydantic import ValidationError

from .. import sm90_table
from ..config import BackendUnavailableError, MLABackendConfig
from ..jit import KernelsUnavailableError, ensure_loaded, prebuilt_manifest
from ..route import flashinfer_available, resolve_route, routes_table, sparse_route
from ..toolkit import ToolkitNotFoundError, find_toolkit


def toolkit_line() -> str:
    try:
        toolkit = find_toolkit()
    except ToolkitNotFoundError as err:
        return f"none ({err}); only needed for GPUs without prebuilt kernels"
    return f"CUDA {toolkit.version[0]}.{toolkit.version[1]} at {toolkit.root}"


def kernels_line(device_index: int, config: MLABackendConfig) -> str:
    """Which library serves this GPU and where it came from (loading it, building it if need be)."""
    try:
        library = ensure_loaded(device_index, config.cache_dir, config.kernel_variant)
    except (KernelsUnavailableError, RuntimeError) as err:
        return f"UNAVAILABLE: {err}"
    return f"{library.arch} ({library.variant.describe(library.arch)}) from the {library.origin}: {library.path}"


def report() -> list[str]:
    lines = [
        f"torch          {torch.__version__} (CUDA {torch.version.cuda})",
        f"CUDA toolkit   {toolkit_line()}",
        f"prebuilt       {', '.join(sorted(prebuilt_manifest())) or 'none here (kernels build on first use)'}",
        f"flashinfer     {'importable' if flashinfer_available() else 'not installed'}",
        f"vllm           {'importable' if importable('vllm') else 'not installed'}",
        f"indexer        {indexer_line()}",
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
            route = resolve_route(config, capability)
            serves = route.describe()
        except BackendUnavailableError as err:
            route, serves = None, f"ERROR: {err}"
        lines.append(
            f"GPU {index}          {props.name}, SM {props.major}.{props.minor}, "
            f"{props.multi_processor_count} SMs -> {serves}"
        )
        if route is not None and route.kernel == "bundled":
            lines.append(f"kernels {index}      {kernels_line(index, config)}")
            if capability[0] == 9 and config.backend == "auto":
                lines.append(f"in vLLM {index}      page 64: vLLM's FlashMLA where faster: {sm90_table.summary()}")
        lines.append(f"sparse {index}       {sparse_line(config, capability)}")
    return lines


def sparse_line(config: MLABackendConfig, capability: tuple[int, int]) -> str:
    """Which kernel serves sparse MLA (DeepSeek-V3.2, GLM-5) on this GPU."""
    try:
        route = sparse_route(config, capability)
    except BackendUnavailableError as err:
        return f"ERROR: {err}"
    return route.describe()


def indexer_line() -> str:
    """What scores the sparse models' indexer in vLLM where DeepGEMM cannot (mla_backend.indexer)."""
    if not importable("triton"):
        return "where DeepGEMM cannot score: torch loops (Triton not installed; slow under CUDA graphs)"
    import triton

    return f"where DeepGEMM cannot score: Triton kernels (triton {triton.__version__})"


def importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def main(routes: bool = False) -> int:
    print("\n".join(routes_table() if routes else report()))
    return 0
