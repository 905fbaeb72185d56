"""The "fp8_ds_mla" KV cache row of sparse MLA (DeepSeek-V3.2, GLM-5): 656 bytes a token.

Bytes [0, 512): the 512 latent values in float8_e4m3fn, quantised per tile of 128 values;
[512, 528): 4 float32 scales, scale j multiplies latent values [128 j, 128 j + 128);
[528, 656): the 64 rope values in bfloat16, stored as they are (vLLM's flashmla_sparse.py docstring).

A tile's scale covers its largest magnitude, so amax / scale <= 448 (e4m3's largest finite value):
  "pow2_fp32" (DeepSeek): the smallest power of two >= max(amax / 448, 1e-4), FlashMLA's test quantiser
      (tests/quant.py) and FlashInfer's SM120 tests; kernels reading this format may take the scale's
      exponent alone.
  "arbitrary_fp32" (GLM): max(amax / 448, FLT_MIN), vLLM's writer (concat_and_cache_ds_mla_kernel).
Latent values are divided by their scale in float32, clamped to +-448 and rounded to nearest even in
e4m3, as the writers' saturating conversion does.
"""

from __future__ import annotations

import torch

from .kernel_constants import DS_MLA_ROPE_OFFSET, DS_MLA_ROW_BYTES, DS_MLA_SCALE_OFFSET

SCALE_FORMATS = ("pow2_fp32", "arbitrary_fp32")

LATENT_VALUES = 512
ROPE_VALUES = 64
TILE_VALUES = 128
NUM_TILES = LATENT_VALUES // TILE_VALUES
E4M3_MAX = 448.0
# Floors of a tile's scale, so a tile of zeros gets a finite, positive one: FlashMLA's clamp of
# amax / 448 (the pow2 scale is then at least 2^-13), and vLLM's fmaxf(.., FLT_MIN).
POW2_SCALE_FLOOR = 1e-4
ARBITRARY_SCALE_FLOOR = torch.finfo(torch.float32).tiny
MANTISSA_MASK = (1 << 23) - 1  # float32's 23 stored mantissa bits


def _round_up_to_power_of_two(scale: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= each positive normal float32. On the bits, exactly: a mantissa of
    zero is already one; any other carries into the exponent once its bits are cleared. (FlashMLA's
    2^ceil(log2 s) in float32 can land one power low just above a power of two, where log2 rounds.)"""
    bits = scale.view(torch.int32)
    return ((bits + MANTISSA_MASK) & ~MANTISSA_MASK).view(torch.float32)


def tile_scales(latent: torch.Tensor, scale_format: str) -> torch.Tensor:
    """float32 [..., 4]: each tile's scale for float32 ``latent`` [..., 4, 128]."""
    amax_over_max = latent.abs().amax(dim=-1) / E4M3_MAX  # float32, as the writers divide
    if scale_format == "pow2_fp32":
        return _round_up_to_power_of_two(amax_over_max.clamp_min(POW2_SCALE_FLOOR))
    return amax_over_max.clamp_min(ARBITRARY_SCALE_FLOOR)


def pack_fp8_ds_mla(rows: torch.Tensor, scale_format: str) -> torch.Tensor:
    """uint8 [..., 656] rows of the cache for ``rows`` [..., 576] (512 latent, then 64 rope values) of any
    float dtype, on their device. The latent is quantised from its float32 values; the rope is rounded
    to bfloat16 (bit for bit when it is bfloat16 already)."""
    if rows.shape[-1] != LATENT_VALUES + ROPE_VALUES:
        raise ValueError(f"rows must end in {LATENT_VALUES + ROPE_VALUES} values, got shape {tuple(rows.shape)}")
    if scale_format not in SCALE_FORMATS:
        raise ValueError(f"scale_format must be one of {SCALE_FORMATS}, got {scale_format!r}")
    if not rows.is_floating_point():
        raise ValueError(f"rows must be floating point, got {rows.dtype}")
    if not torch.isfinite(rows).all():  # a NaN or inf would poison its tile's scale
        raise ValueError("rows hold a NaN or an infinity")
    lead = rows.shape[:-1]
    latent = rows[..., :LATENT_VALUES].to(torch.float32).reshape(*lead, NUM_TILES, TILE_VALUES)
    scales = tile_scales(latent, scale_format)
    scaled = (latent / scales.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX)
    packed = torch.empty(*lead, DS_MLA_ROW_BYTES, dtype=torch.uint8, device=rows.device)
    packed[..., :DS_MLA_SCALE_OFFSET] = scaled.to(torch.float8_e4m3fn).reshape(*lead, LATENT_VALUES).view(torch.uint8)
    packed[..., DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET] = scales.contiguous().view(torch.uint8)
    rope = rows[..., LATENT_VALUES:].to(torch.bfloat16).contiguous()
    packed[..., DS_MLA_ROPE_OFFSET:] = rope.view(torch.uint8)
    return packed


def unpack_fp8_ds_mla(packed: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """[..., 576] values of uint8 cache rows [..., 656]: latent x its tile's scale, then the rope as
    stored. Exact in float64 (a 4-bit by a 24-bit significand), rounded once in a narrower ``dtype``."""
    if packed.dtype != torch.uint8 or packed.shape[-1] != DS_MLA_ROW_BYTES:
        raise ValueError(f"packed must be uint8 [..., {DS_MLA_ROW_BYTES}], got {packed.dtype} {tuple(packed.shape)}")
    lead = packed.shape[:-1]
    codes = packed[..., :DS_MLA_SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn)
    scales = packed[..., DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32)
    rope = packed[..., DS_MLA_ROPE_OFFSET:].contiguous().view(torch.bfloat16)
    latent = codes.to(torch.float64).reshape(*lead, NUM_TILES, TILE_VALUES) * scales.to(torch.float64).unsqueeze(-1)
    rows = torch.cat((latent.reshape(*lead, LATENT_VALUES), rope.to(torch.float64)), dim=-1)
    return rows.to(dtype)
