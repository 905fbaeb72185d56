"""``vllm serve`` with data-parallel attention and expert parallelism, as DeepSeek is served: every rank
holds all query heads and the KV cache of its own requests, the MoE layers' experts are split over the
ranks. The command line, the MoE kernels it needs, its greedy traffic through the ``openai`` client,
and each rank's float64 decode-check summary (vllm_worker_check writes one per rank). No verdicts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from integration.engines.vllm_client import client_for, complete
from integration.engines.vllm_server import serve_command
from integration.engines.vllm_spec import EngineSpec

# What vLLM 0.26's MoE layers call from vllm/_moe_C_stable_libtorch.abi3.so for a bf16 DeepSeek-V3
# (topk_method noaux_tc, sigmoid scores) with expert parallelism on SM90, read from its source:
# grouped_topk (fused_moe/router/grouped_topk_router.py: fused_grouped_topk, taken where the router
# has e_score_correction_bias, VLLM_USE_FUSED_MOE_GROUPED_TOPK=1 by default), moe_align_block_size
# (fused_moe/fused_moe.py _prepare_expert_assignment: always where an expert map exists, as under EP)
# and moe_sum (fused_moe/experts/triton_moe.py TritonExperts.moe_sum). The rest is Triton and _C.
MOE_OPS = ("grouped_topk", "moe_align_block_size", "moe_sum")


def dp_serve_command(spec: EngineSpec, model: str, port: int, dp: int, **kwargs) -> list[str]:
    """serve_command, plus ``dp`` data-parallel ranks with the experts split over them."""
    return serve_command(spec, model, port, **kwargs) + ["--data-parallel-size", str(dp), "--enable-expert-parallel"]


def missing_moe_ops() -> list[str]:
    """MOE_OPS that this process cannot call. vLLM imports its MoE library inside a bare
    ``contextlib.suppress(ImportError)``: without it a server starts and fails at the first MoE layer."""
    import torch

    try:
        import vllm._moe_C_stable_libtorch  # noqa: F401
    except ImportError as err:
        return [f"{op} (vllm._moe_C_stable_libtorch: {err})" for op in MOE_OPS]
    return [op for op in MOE_OPS if not hasattr(torch.ops._moe_C, op)]


def rank_summaries(directory: Path) -> dict[int, dict]:
    """Each rank's own decode-check summary (``rank<N>.json``; a rank that wrote none is absent)."""
    return {
        int(p.stem.removeprefix("rank")): json.loads(p.read_text()) for p in sorted(Path(directory).glob("rank*.json"))
    }


async def traffic(port: int, model: str, phases: dict[str, dict]) -> dict[str, list[dict]]:
    """Each phase in turn: ``{"prompts", "max_tokens", "mode"}``, mode ``together`` (all at once),
    ``alone`` (one after another: one request for two or more ranks) or ``staggered`` (arrivals
    ``gap_s`` apart, so that the requests in flight ramp up from one)."""
    results = {}
    async with client_for(port) as client:
        for name, phase in phases.items():
            prompts, n = phase["prompts"], phase["max_tokens"]
            if phase["mode"] == "alone":
                results[name] = [await complete(client, model, p, n) for p in prompts]
            else:
                gap = phase.get("gap_s", 0.0) if phase["mode"] == "staggered" else 0.0
                jobs = (complete(client, model, p, n, i * gap) for i, p in enumerate(prompts))
                results[name] = list(await asyncio.gather(*jobs))
    return results
