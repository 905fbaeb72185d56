"""Which kernel serves MLA decode, and why: the one place that decides.

    route = resolve_route(config, (12, 0), DecodeShape(heads=16, q_len=4, kv_fp8=True), VLLM_ENGINE)
    route.describe()  # 'bundled (sm_120a, fp8: e4m3 QK^T, f16 P.V, 32-row tile): auto: SM 12.0 -> ...'

The rules, in the order they apply:
1. An explicit ``backend`` runs where it can and raises ``BackendUnavailableError`` where it cannot:
   "xqa" (the bundled kernels) on the capabilities they are built for (targets.ARCH_BY_CAPABILITY),
   "trtllm-gen" (FlashInfer's) on SM 10.0/10.3 with FlashInfer installed.
2. ``auto``: FlashInfer's trtllm-gen on SM 10.0/10.3 where FlashInfer is installed; else the bundled
   kernels where they are built for the GPU; else the engine's portable MLA decode ("fallback").
3. A model the kernels do not take (latent or rope width, pre-absorption nope dim, heads per GPU)
   goes to the engine's portable decode under ``auto``; an explicit backend raises.
4. ``auto`` on SM 9.0, where the bundled kernels would serve: the engine's FlashMLA instead for the
   shape classes the measured table (sm90_table.py) has it faster at, with pages of 64 tokens.
5. FlashInfer's trtllm-gen reads pages of 16 to 128 tokens: a cache of another page (SGLang's default
   of 1) decodes on the bundled kernels under ``auto``; an explicit ``trtllm-gen`` raises.
6. Sparse index lists (DeepSeek Sparse Attention: DeepSeek-V3.2, GLM-5) run the bundled kernels on
   every GPU they are built for, under ``auto`` and ``xqa`` alike; ``trtllm-gen`` raises, and so does
   a GPU they are not built for. No engine's FlashMLA sparse decode stands in for them: faster at 64
   and 128 heads, but inside vLLM 0.26 its rows were off by up to 6.7e-2 where ours were 2.3e-3
   (docs/vllm.md).
A bundled route names its variant: the architecture's library, the FP8 kernels' products (``fp8_qk``
and ``fp8_pv``, resolved per architecture by kernel_build.KernelVariant) and the tile its rows
(heads x query tokens) take.

Engines resolve once, at init (vLLM per engine, SGLang per model runner), and hand the route to the
op and the step plan, which never resolve one they were given. The route is a frozen value: logs,
``python -m mla_backend doctor`` and the engine checks read it, never a module-level record.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Literal

import torch

from . import shapes
from .config import BackendName, BackendUnavailableError, MLABackendConfig
from .launcher import tile_shape
from .sm90_table import FLASHMLA_PAGE_SIZE, flashmla_verdict
from .targets import ARCH_BY_CAPABILITY, TRTLLM_GEN_CAPABILITIES, bundled_arch, served_capabilities

TRTLLM_GEN_PAGE_SIZES = (16, 32, 64, 128)  # the pages trtllm-gen reads; ours read any of shapes.PAGE_SIZES

# bundled: our kernels; trtllm-gen: FlashInfer's (SM100); flashmla: the engine's FlashMLA (SM90,
# auto, where measured faster); fallback: the engine's portable MLA decode; reference: the op's
# float64 reference on CPU tensors.
KernelName = Literal["bundled", "trtllm-gen", "flashmla", "fallback", "reference"]


@dataclass(frozen=True)
class Engine:
    """What the caller offers beside our kernels."""

    name: str
    fallback: str | None  # its portable MLA decode, as a reason names it; None: the op, which refuses
    fallback_kernel: str | None = None  # the same, as an error message for an explicit backend names it
    # FlashMLA's dense decode in this engine: (available, why not); None where the engine has none.
    flashmla: tuple[bool, str | None] | None = None


OP = Engine("op", None)


@dataclass(frozen=True)
class DecodeShape:
    """What an engine decodes all its life (one shape class): the route's inputs beside the GPU."""

    heads: int | None  # query heads per GPU (after decode context parallelism gathers them); None: unknown
    q_len: int = 1  # query tokens per request (1 + speculative tokens)
    kv_fp8: bool = False
    page_size: int | None = None  # tokens per KV page; None: unknown
    kv_lora_rank: int | None = shapes.KV_LORA_RANK  # None: not an MLA model
    rope_dim: int = shapes.ROPE_DIM
    qk_nope_head_dim: int = 128
    dcp: int = 1  # decode context parallel size

    def describe(self) -> str:
        kv = "fp8" if self.kv_fp8 else "bf16"
        gathered = f" (gathered over DCP {self.dcp})" if self.dcp > 1 else ""
        return f"{self.heads} heads{gathered}, {self.q_len} query tokens, page {self.page_size}, {kv} KV"


@dataclass(frozen=True)
class Route:
    kernel: KernelName
    reason: str
    fallback: str  # what serves decode where this kernel cannot (another GPU, another model); "none": raises
    arch: str | None = None  # the bundled library's architecture
    variant: str | None = None  # the bundled kernel for the shape, where one was given

    @property
    def backend(self) -> BackendName:
        """The op's ``backend`` value that runs this route's kernel."""
        if self.kernel == "bundled":
            return "xqa"
        if self.kernel == "trtllm-gen":
            return "trtllm-gen"
        raise BackendUnavailableError(f"no mla_backend kernel serves this decode: {self.reason}")

    def describe(self) -> str:
        where = ", ".join(part for part in (self.arch, self.variant) if part)
        return f"{self.kernel}{f' ({where})' if where else ''}: {self.reason}"


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def _cc(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"


def bundled_variant(arch: str, config: MLABackendConfig, shape: DecodeShape | None) -> str | None:
    """The bundled kernel a shape runs: FP8 products and the tile its rows take."""
    if shape is None or shape.heads is None:
        return None
    rows = shape.heads * shape.q_len
    if shape.kv_fp8:
        products = config.kernel_variant.resolved(arch)
        kind = f"fp8: {products.fp8_qk} QK^T, {products.fp8_pv} P.V"
    else:
        kind = "bf16"
    row_groups, fragments = tile_shape(rows, shape.kv_fp8)
    return f"{kind}, {16 * row_groups * fragments}-row tile"


def model_problem(shape: DecodeShape) -> str | None:
    """Why the kernels cannot decode this model's attention, or None."""
    if shape.kv_lora_rank is None:
        return "mla_backend serves MLA models (kv_lora_rank, qk_rope_head_dim in the config)"
    if (shape.kv_lora_rank, shape.rope_dim) != (shapes.KV_LORA_RANK, shapes.ROPE_DIM):
        return (
            f"mla_backend needs kv_lora_rank {shapes.KV_LORA_RANK} and qk_rope_head_dim {shapes.ROPE_DIM}, "
            f"the model has {shape.kv_lora_rank} and {shape.rope_dim}"
        )
    if shape.qk_nope_head_dim not in shapes.QK_NOPE_HEAD_DIMS:
        return (
            f"mla_backend needs qk_nope_head_dim in {shapes.QK_NOPE_HEAD_DIMS}, the model has {shape.qk_nope_head_dim}"
        )
    if shape.heads is not None and not 1 <= shape.heads <= shapes.MAX_HEADS:
        return f"mla_backend decodes 1..{shapes.MAX_HEADS} query heads per GPU, this setup gives {shape.heads}"
    return None


def gpu_route(config: MLABackendConfig, capability: tuple[int, int], has_flashinfer: bool | None = None) -> Route:
    """Rules 1 and 2: the kernel that serves decode on a GPU of ``capability``."""
    capability = (int(capability[0]), int(capability[1]))
    has_flashinfer = flashinfer_available() if has_flashinfer is None else has_flashinfer
    cc = _cc(capability)
    arch = bundled_arch(capability)
    fallback = "the engine's portable MLA decode"
    if config.backend == "xqa":
        if arch is None:
            raise BackendUnavailableError(
                f"backend='xqa' needs compute capability {served_capabilities()}; this GPU is {cc}. "
                "Use backend='auto' to fall back to the engine's portable MLA decode instead."
            )
        return Route("bundled", f"backend='xqa' requested; SM {cc} runs the bundled mma.sync kernels", "none", arch)
    if config.backend == "trtllm-gen":
        if capability not in TRTLLM_GEN_CAPABILITIES:
            raise BackendUnavailableError(
                f"backend='trtllm-gen' needs compute capability 10.0 or 10.3 (B200/B300/GB300); this GPU is {cc}. "
                "Use backend='auto' to pick the bundled kernels or the portable fallback instead."
            )
        if not has_flashinfer:
            raise BackendUnavailableError(
                f"backend='trtllm-gen' needs FlashInfer (pip install flashinfer-python); SM {cc} could run it "
                "but flashinfer is not importable. Use backend='auto' to use the bundled kernels instead."
            )
        return Route("trtllm-gen", f"backend='trtllm-gen' requested; SM {cc} with FlashInfer installed", "none")
    if capability in TRTLLM_GEN_CAPABILITIES and has_flashinfer:
        reason = f"auto: SM {cc} with FlashInfer installed -> FlashInfer trtllm-gen"
        return Route("trtllm-gen", reason, fallback, arch)
    if arch is not None:
        why = ", FlashInfer is not installed" if capability in TRTLLM_GEN_CAPABILITIES else ""
        return Route("bundled", f"auto: SM {cc}{why} -> bundled mma.sync kernels", fallback, arch)
    return Route(
        "fallback",
        f"auto: SM {cc} is not served by the bundled kernels (built for {served_capabilities()}) "
        "-> the engine's portable MLA decode",
        fallback,
    )


def resolve_route(
    config: MLABackendConfig,
    capability: tuple[int, int],
    shape: DecodeShape | None = None,
    engine: Engine = OP,
    has_flashinfer: bool | None = None,
) -> Route:
    """The route of an engine's (or a call's) decode. Raises ``BackendUnavailableError`` where an
    explicit backend cannot serve it. Pure: every caller with the same inputs gets the same route,
    whatever the order of the calls."""
    route = gpu_route(config, capability, has_flashinfer)
    if engine.fallback is not None and route.fallback != "none":
        route = replace(route, fallback=engine.fallback)
    if route.kernel == "fallback" or shape is None:
        return route
    problem = model_problem(shape)
    if problem is not None:  # rule 3
        if config.backend != "auto":
            instead = engine.fallback_kernel or "the engine's portable MLA decode"
            raise BackendUnavailableError(f"{problem}; backend='auto' decodes such models with {instead}")
        return Route("fallback", f"auto: {problem} -> {engine.fallback or 'no kernel'}", route.fallback)
    if route.kernel == "trtllm-gen":
        route = trtllm_gen_page_rule(config, shape, route)
    if route.kernel != "bundled":
        return route
    assert route.arch is not None
    route = replace(route, variant=bundled_variant(route.arch, config, shape))
    return flashmla_rule(config, capability, shape, engine, route)


def trtllm_gen_page_rule(config: MLABackendConfig, shape: DecodeShape, route: Route) -> Route:
    """Rule 5: a page trtllm-gen does not read goes to the bundled kernels under auto."""
    if shape.page_size is None or shape.page_size in TRTLLM_GEN_PAGE_SIZES:
        return route
    why = f"FlashInfer's trtllm-gen reads pages of {TRTLLM_GEN_PAGE_SIZES} tokens, the cache has {shape.page_size}"
    if config.backend == "trtllm-gen" or route.arch is None:
        instead = "backend='auto' decodes it with the bundled kernels" if route.arch else "use a page of those"
        raise BackendUnavailableError(f"{why}; {instead}")
    return Route("bundled", f"{route.reason}; {why} -> bundled mma.sync kernels", route.fallback, route.arch)


def flashmla_rule(
    config: MLABackendConfig, capability: tuple[int, int], shape: DecodeShape, engine: Engine, route: Route
) -> Route:
    """Rule 4: auto on SM90 hands decode to the engine's FlashMLA where the measured table has it faster."""
    if config.backend != "auto" or capability[0] != 9 or engine.flashmla is None or shape.heads is None:
        return route
    name = f"{engine.name}'s FlashMLA"
    if shape.page_size != FLASHMLA_PAGE_SIZE:
        why = f"FlashMLA reads pages of {FLASHMLA_PAGE_SIZE} tokens, the cache has {shape.page_size}"
    else:
        ok, unavailable = engine.flashmla
        faster, why = flashmla_verdict(shape.heads, shape.q_len, shape.kv_fp8, shape.describe()) if ok else (False, "")
        if not ok:
            why = f"{name} is unavailable: {unavailable}"
        elif faster:
            return Route("flashmla", f"auto: SM {_cc(capability)} -> {name}: {why}", "the bundled kernels")
    return replace(route, reason=f"{route.reason}; keeps the bundled kernels over {name}: {why}")


def op_route(device: torch.device, config: MLABackendConfig, backend: BackendName = "auto") -> Route:
    """The route of one op call that was handed none: the GPU's (rules 1 and 2), the float64 reference
    for CPU tensors. Raises ``BackendUnavailableError`` where no kernel serves the GPU, as FlashInfer
    does on a GPU it has no kernel for."""
    if device.type != "cuda":
        return Route("reference", "CPU tensors run the float64 reference", "none")
    if backend != "auto":
        config = config.model_copy(update={"backend": MLABackendConfig(backend=backend).backend})
    route = resolve_route(config, config.capability(torch.cuda.get_device_capability(device)))
    if route.kernel == "fallback":
        raise BackendUnavailableError(
            f"no MLA decode kernel here: {route.reason}. The vLLM plugin serves such GPUs with vLLM's "
            "Triton MLA; the op runs the float64 reference on CPU tensors"
        )
    return route


def routes_table(config: MLABackendConfig | None = None) -> list[str]:
    """docs/design.md's "which kernel runs" table, made by resolve_route over the GPUs of
    targets.ARCH_BY_CAPABILITY and one older, at a few shape classes (vLLM with FlashMLA available,
    FlashInfer not installed)."""
    from .sm90_table import load_table

    config = config or MLABackendConfig()
    engine = Engine("vLLM", "vLLM's Triton MLA decode", "vLLM's Triton MLA kernel", (True, None))
    table = load_table()
    gpus = [(8, 0), *ARCH_BY_CAPABILITY]
    rows = [
        f"| SM | heads x query tokens, KV | kernel | variant | why (FlashMLA weighed on SM90 from {table['device']}) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for capability in gpus:
        for heads, q_len, fp8 in ((16, 1, True), (16, 4, True), (128, 1, True), (16, 1, False), (128, 4, False)):
            shape = DecodeShape(heads, q_len, fp8, page_size=FLASHMLA_PAGE_SIZE)
            route = resolve_route(config, capability, shape, engine, has_flashinfer=False)
            kv = "fp8" if fp8 else "bf16"
            rows.append(
                f"| {_cc(capability)} | {heads} x {q_len}, {kv} | {route.kernel} | "
                f"{', '.join(p for p in (route.arch, route.variant) if p) or '-'} | {route.reason} |"
            )
    return rows


def sparse_route(config: MLABackendConfig, capability: tuple[int, int]) -> Route:
    """Rule 6: the route of a sparse decode call on a GPU of ``capability``; raises
    ``BackendUnavailableError`` where the bundled kernels cannot serve it."""
    capability = config.capability(capability)
    cc = _cc(capability)
    arch = bundled_arch(capability)
    if config.backend == "trtllm-gen":
        raise BackendUnavailableError(
            "sparse MLA decode runs the bundled kernels; backend='trtllm-gen' has no sparse path here "
            "(use backend='auto' or 'xqa')"
        )
    if arch is None:
        raise BackendUnavailableError(
            f"sparse MLA decode (backend={config.backend!r}) needs compute capability {served_capabilities()} "
            f"(the bundled kernels); this GPU is {cc}"
        )
    return Route("bundled", f"sparse index lists: SM {cc} -> bundled mma.sync kernels", "none", arch)


__all__ = [
    "OP",
    "TRTLLM_GEN_PAGE_SIZES",
    "BackendUnavailableError",
    "DecodeShape",
    "Engine",
    "Route",
    "flashinfer_available",
    "op_route",
    "resolve_route",
    "routes_table",
    "sparse_route",
]
