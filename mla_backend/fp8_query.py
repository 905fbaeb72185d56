"""The query in e4m3 for FlashInfer's FP8-KV MLA path: the kernels take q and KV in one dtype, so a
bf16 query is quantised on the device with one per-tensor scale (no host sync: CUDA-graph safe)."""

from __future__ import annotations

import torch

E4M3_MAX = 448.0


def quantise_query(
    q_nope: torch.Tensor, q_pe: torch.Tensor, rope_ratio: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q_nope e4m3, q_pe e4m3, scale fp32 [1]) with q ~= q8 * scale, q_pe first multiplied by
    ``rope_ratio`` (kpe_scale / ckv_scale) so that one bmm1 scale (ckv_scale) serves both parts."""
    nope = q_nope.float()
    rope = q_pe.float() * rope_ratio
    amax = torch.maximum(nope.abs().amax(), rope.abs().amax())
    # Clamped away from 0 so an all-zero query quantises to zeros, not NaN.
    scale = (amax / E4M3_MAX).clamp_min(torch.finfo(torch.float32).tiny).reshape(1)

    def to_e4m3(t: torch.Tensor) -> torch.Tensor:
        return (t / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

    return to_e4m3(nope), to_e4m3(rope), scale
