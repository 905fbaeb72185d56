"""The fp8_ds_mla cache row (mla_backend.sparse_cache): its bytes, its two scale rules and the round trip.

Round-trip bound, per latent value x of a tile stored with scale s (amax / s <= 448 by construction):
x / s is rounded to nearest in e4m3, whose 3 stored mantissa bits put half an ulp at <= 2^-4 of a
normal value, and whose subnormal step is 2^-9 (half: 2^-10). So |x - dequantised| <= 2^-4 |x| + 2^-10 s,
widened by 2^-20 for the float32 division before the rounding. Rope values are stored, not rounded.
"""

import math
import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from property_budget import examples

from mla_backend.sparse_cache import (
    DS_MLA_ROPE_OFFSET,
    DS_MLA_ROW_BYTES,
    DS_MLA_SCALE_OFFSET,
    SCALE_FORMATS,
    pack_fp8_ds_mla,
    unpack_fp8_ds_mla,
)

NORMAL_HALF_ULP = 2.0**-4
SUBNORMAL_HALF_STEP = 2.0**-10
DIVISION_SLACK = 1 + 2.0**-20


def random_rows(shape, seed: int, dtype=torch.bfloat16, tile_exponents=(-12, -3, 0, 9), spread: float = 16.0):
    """Rows [..., 576], never zero: each latent tile at its own magnitude 2^e with values spread over
    2^-spread .. 1 of it (reaching e4m3's subnormals), random signs; the rope near 1."""
    gen = torch.Generator().manual_seed(seed)
    magnitude = torch.exp2(-spread * torch.rand(*shape, 576, generator=gen, dtype=torch.float64))
    sign = torch.where(torch.rand(*shape, 576, generator=gen) < 0.5, -1.0, 1.0).double()
    tiles = torch.tensor([2.0**e for e in tile_exponents], dtype=torch.float64).repeat_interleave(128)
    rows = sign * magnitude
    rows[..., :512] *= tiles
    return rows.to(dtype)


def stored_scales(packed: torch.Tensor) -> torch.Tensor:
    return packed[..., DS_MLA_SCALE_OFFSET:DS_MLA_ROPE_OFFSET].contiguous().view(torch.float32).double()


def tile_amax(rows: torch.Tensor) -> torch.Tensor:
    return rows[..., :512].double().reshape(*rows.shape[:-1], 4, 128).abs().amax(-1)


def assert_round_trip_within_e4m3(rows: torch.Tensor, packed: torch.Tensor):
    back = unpack_fp8_ds_mla(packed)
    x = rows[..., :512].double()
    scales = stored_scales(packed).repeat_interleave(128, dim=-1)
    bound = (NORMAL_HALF_ULP * x.abs() + SUBNORMAL_HALF_STEP * scales) * DIVISION_SLACK
    err = (back[..., :512] - x).abs()
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item()}"
    assert torch.equal(back[..., 512:], rows[..., 512:].to(torch.bfloat16).double())


def assert_smallest_power_of_two_covering(scales: torch.Tensor, amax: torch.Tensor):
    """Each scale is 2^k, the least one >= max(amax / 448, 1e-4)."""
    floor = torch.clamp_min(amax / 448.0, 1e-4)
    mantissa, _ = torch.frexp(scales)
    assert (mantissa == 0.5).all(), scales
    assert (scales >= floor).all() and (scales / 2 < floor).all(), (scales, floor)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("scale_format", SCALE_FORMATS)
def test_round_trip_is_within_e4m3_rounding(scale_format, dtype):
    exponents = (-7, -1, 2, 6) if dtype == torch.float16 else (-12, -3, 0, 9)  # float16 tops out at 65504
    rows = random_rows((3, 5), seed=7, dtype=dtype, tile_exponents=exponents)
    packed = pack_fp8_ds_mla(rows, scale_format)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, DS_MLA_ROW_BYTES)
    assert_round_trip_within_e4m3(rows, packed)


def test_pow2_scales_are_the_least_power_of_two_covering_the_tile():
    rows = random_rows((64,), seed=3, dtype=torch.float32, tile_exponents=(-20, -4, 3, 17))
    packed = pack_fp8_ds_mla(rows, "pow2_fp32")
    assert_smallest_power_of_two_covering(stored_scales(packed), tile_amax(rows))


@pytest.mark.parametrize(
    "amax, scale",
    [(448.0, 1.0), (449.0, 2.0), (14.0, 2.0**-5), (1344.0, 4.0), (0.001, 2.0**-13), (448.0 * 2.0**-13, 2.0**-13)],
)
def test_pow2_scale_of_known_tiles(amax, scale):
    """Powers of two at the boundary stay; just above one round up; amax / 448 under 1e-4 meets the floor."""
    rows = random_rows((1,), seed=11, dtype=torch.float32, tile_exponents=(-1, -1, -1, -1), spread=2.0)
    rows[0, 128:256] *= amax  # magnitudes below amax / 2
    rows[0, 130] = amax
    assert stored_scales(pack_fp8_ds_mla(rows, "pow2_fp32"))[0, 1].item() == scale


def test_arbitrary_scales_are_amax_over_448_in_float32():
    rows = random_rows((64,), seed=5, dtype=torch.float32, tile_exponents=(-20, -4, 3, 17))
    scales = stored_scales(pack_fp8_ds_mla(rows, "arbitrary_fp32"))
    amax32 = rows[..., :512].reshape(64, 4, 128).abs().amax(-1)  # float32, as the value is stored
    assert torch.equal(scales, (amax32 / torch.tensor(448.0, dtype=torch.float32)).double())
    exact = tile_amax(rows) / 448.0
    assert ((scales - exact).abs() <= exact * 2.0**-24).all()  # float32's half ulp of the true quotient
    assert (torch.frexp(scales)[0] != 0.5).any()  # not silently powers of two


@pytest.mark.parametrize(
    "scale_format, floor", [("pow2_fp32", 2.0**-13), ("arbitrary_fp32", torch.finfo(torch.float32).tiny)]
)
def test_a_tile_of_zeros_gets_a_finite_positive_scale(scale_format, floor):
    rows = random_rows((2,), seed=1, dtype=torch.bfloat16)
    rows[1, 256:384] = 0.0  # tile 2 of row 1
    packed = pack_fp8_ds_mla(rows, scale_format)
    scales = stored_scales(packed)
    assert scales[1, 2].item() == floor
    back = unpack_fp8_ds_mla(packed)
    assert torch.equal(back[1, 256:384], torch.zeros(128, dtype=torch.float64))
    assert torch.isfinite(back).all()
    assert_round_trip_within_e4m3(rows, packed)


def test_rope_bytes_are_the_bfloat16_values_bit_for_bit():
    rows = random_rows((4, 2), seed=9, dtype=torch.bfloat16)
    rows[0, 0, 512:520] = torch.tensor([-0.0, 1e-38, -3e38, 2.0**-133, 65504.0, -1.0, 0.1, 7.0])  # edges of bf16
    packed = pack_fp8_ds_mla(rows, "pow2_fp32")
    assert torch.equal(packed[..., DS_MLA_ROPE_OFFSET:], rows[..., 512:].contiguous().view(torch.uint8))
    rope = unpack_fp8_ds_mla(packed, dtype=torch.bfloat16)[..., 512:]
    assert torch.equal(rope.view(torch.int16), rows[..., 512:].view(torch.int16))  # -0.0 stays -0.0


# e4m3fn bytes (sign, 4 exponent bits with bias 7, 3 mantissa bits) of values that need no rounding.
E4M3_BYTES = {1.0: 0x38, -2.0: 0xC0, 0.5: 0x30, 448.0: 0x7E, -448.0: 0xFE, 1.5: 0x3C, 2.0**-9: 0x01, -1.5: 0xBC}


def constructed_row() -> torch.Tensor:
    """Tiles 0..2: the values above (-1.5 filling the rest) times 2^(j - 1), so amax = 448 x 2^(j - 1) and
    both formats' scale is 2^(j - 1). Tile 3: -1.0 but for a last value of 1344, where the formats part.
    The rope: 1.0, -2.0, then 0.375."""
    base = torch.full((128,), -1.5, dtype=torch.float32)
    base[: len(E4M3_BYTES)] = torch.tensor(list(E4M3_BYTES), dtype=torch.float32)
    tile3 = torch.full((128,), -1.0)
    tile3[-1] = 1344.0
    rope = torch.full((64,), 0.375)
    rope[:2] = torch.tensor([1.0, -2.0])
    return torch.cat([base * 0.5, base, base * 2.0, tile3, rope])


@pytest.mark.parametrize(
    "scale_format, tile3_scale_bytes, tile3_bytes",
    [
        # scale 4 (0x40800000): -1/4 = -0.25 is 0xA8; 1344/4 = 336 lies halfway between 320 and 352 and
        # ties to the even mantissa, 320 = 0x7A.
        ("pow2_fp32", [0x00, 0x00, 0x80, 0x40], [0xA8] * 127 + [0x7A]),
        # scale 1344/448 = 3 (0x40400000): -1/3 rounds to -0.34375 = 0xAB; 1344/3 = 448 = 0x7E.
        ("arbitrary_fp32", [0x00, 0x00, 0x40, 0x40], [0xAB] * 127 + [0x7E]),
    ],
)
def test_bytes_at_their_offsets(scale_format, tile3_scale_bytes, tile3_bytes):
    packed = pack_fp8_ds_mla(constructed_row(), scale_format).tolist()
    codes = list(E4M3_BYTES.values()) + [E4M3_BYTES[-1.5]] * (128 - len(E4M3_BYTES))
    for j in range(3):
        assert packed[128 * j : 128 * (j + 1)] == codes, f"tile {j}"
    assert packed[384:512] == tile3_bytes
    # float32 scales, little-endian: 0.5 = 0x3F000000, 1.0 = 0x3F800000, 2.0 = 0x40000000.
    assert packed[512:528] == [0, 0, 0, 0x3F, 0, 0, 0x80, 0x3F, 0, 0, 0, 0x40] + tile3_scale_bytes
    # bfloat16 rope, little-endian: 1.0 = 0x3F80, -2.0 = 0xC000, 0.375 = 0x3EC0.
    assert packed[528:] == [0x80, 0x3F, 0x00, 0xC0] + [0xC0, 0x3E] * 62


def e4m3_value(byte: int) -> float:
    """e4m3fn's value from its bits: bias 7, subnormals at exponent 0 (no infinities; 0x7F / 0xFF are NaN)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exponent, mantissa = (byte >> 3) & 0xF, byte & 0x7
    if exponent == 0:
        return sign * mantissa * 2.0**-9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def decode_row(row_bytes: list[int]) -> list[float]:
    """A 656-byte row read with struct and the e4m3 formula: no torch views, Python float64 products."""
    raw = bytes(row_bytes)
    scales = struct.unpack("<4f", raw[512:528])
    latent = [e4m3_value(b) * scales[i // 128] for i, b in enumerate(raw[:512])]
    # A bfloat16 is the top half of a float32.
    rope = [struct.unpack("<f", b"\0\0" + raw[528 + 2 * k : 530 + 2 * k])[0] for k in range(64)]
    return latent + rope


@pytest.mark.parametrize("scale_format", SCALE_FORMATS)
def test_unpack_is_exactly_an_independent_decoding_of_the_bytes(scale_format):
    packed = pack_fp8_ds_mla(random_rows((3,), seed=8, dtype=torch.float32), scale_format)
    want = torch.tensor([decode_row(row) for row in packed.tolist()], dtype=torch.float64)
    assert torch.equal(unpack_fp8_ds_mla(packed), want)


def test_unpack_in_a_narrower_dtype_rounds_the_exact_values_once():
    packed = pack_fp8_ds_mla(random_rows((6,), seed=2), "arbitrary_fp32")
    assert torch.equal(unpack_fp8_ds_mla(packed, torch.float32), unpack_fp8_ds_mla(packed).float())


def test_leading_dimensions_and_views_pack_row_by_row():
    rows = random_rows((2, 3, 4), seed=4, dtype=torch.float32)
    packed = pack_fp8_ds_mla(rows.transpose(0, 2), "pow2_fp32")  # a non-contiguous view
    assert torch.equal(packed, pack_fp8_ds_mla(rows, "pow2_fp32").transpose(0, 2))
    assert torch.equal(unpack_fp8_ds_mla(packed[1:, ::2]), unpack_fp8_ds_mla(packed)[1:, ::2])


@pytest.mark.parametrize(
    "rows, scale_format, message",
    [
        (torch.ones(2, 575), "pow2_fp32", "576 values"),
        (torch.ones(2, 576, 1), "pow2_fp32", "576 values"),
        (torch.ones(2, 576), "ue8m0", "scale_format"),
        (torch.ones(2, 576), "POW2_FP32", "scale_format"),
        (torch.ones(2, 576, dtype=torch.int32), "pow2_fp32", "floating point"),
        (torch.full((2, 576), math.inf), "arbitrary_fp32", "NaN or an infinity"),
        (torch.full((2, 576), math.nan), "pow2_fp32", "NaN or an infinity"),
    ],
)
def test_pack_refuses(rows, scale_format, message):
    with pytest.raises(ValueError, match=message):
        pack_fp8_ds_mla(rows, scale_format)


@pytest.mark.parametrize(
    "packed", [torch.ones(2, 655, dtype=torch.uint8), torch.ones(2, 656, dtype=torch.int8), torch.ones(2, 656)]
)
def test_unpack_refuses_anything_but_uint8_rows_of_656(packed):
    with pytest.raises(ValueError, match="uint8"):
        unpack_fp8_ds_mla(packed)


@settings(max_examples=examples(300, quick=40), deadline=None, derandomize=True, database=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 9),
    tile_exponents=st.tuples(*[st.integers(-40, 40)] * 4),
    spread=st.floats(0.0, 30.0),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    scale_format=st.sampled_from(SCALE_FORMATS),
)
def test_round_trip_property(seed, rows, tile_exponents, spread, dtype, scale_format):
    data = random_rows((rows,), seed, dtype, tile_exponents, spread)
    packed = pack_fp8_ds_mla(data, scale_format)
    assert_round_trip_within_e4m3(data, packed)
    scales = stored_scales(packed)
    if scale_format == "pow2_fp32":
        assert_smallest_power_of_two_covering(scales, tile_amax(data))
    else:
        assert torch.equal(scales, (tile_amax(data).float() / 448.0).double())
