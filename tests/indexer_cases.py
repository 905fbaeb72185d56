"""Indexer test inputs and their float64 loops, shared by the torch path's tests (test_indexer_cpu.py)
and the Triton kernels' (test_indexer_triton.py, interpreted on CPU; test_indexer_gpu.py)."""

import math

import torch

FP8 = torch.float8_e4m3fn
HEADS, DIM = 8, 128


def away_from_zero(gen, *shape, scale=1.0):
    """Gaussian magnitudes shifted off zero, random signs: no input is 0 (nor 0 after e4m3)."""
    x = torch.randn(*shape, generator=gen)
    return torch.sign(x + (x == 0)) * (0.25 + x.abs()) * scale


def quantize_tokens(k, ue8m0=False):
    """What vLLM's indexer_k_quant_and_cache stores per token (head_dim = quant_block_size = 128):
    scale = max(amax, 1e-4) / 448 (ue8m0: rounded up to a power of two), values = k / scale in e4m3."""
    scale = k.abs().amax(dim=-1).clamp(min=1e-4) / 448.0
    if ue8m0:
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return (k / scale[:, None]).to(FP8), scale.float()


def write_cache(cache, values, scales, slots):
    """Token i into slot slots[i] of the [num_blocks, block_size, 1, D + 4] uint8 cache: its D e4m3
    bytes at block_offset * D, its fp32 scale at block_size * D + 4 * block_offset within the block."""
    block_size = cache.shape[1]
    flat = cache.view(cache.shape[0], -1)
    slots = torch.as_tensor(slots, dtype=torch.long, device=cache.device).reshape(-1)
    block, offset = (slots // block_size)[:, None], (slots % block_size)[:, None]
    flat[block, offset * DIM + torch.arange(DIM, device=cache.device)] = values.reshape(-1, DIM).view(torch.uint8)
    scale_bytes = scales.reshape(-1, 1).float().contiguous().view(torch.uint8)
    flat[block, block_size * DIM + 4 * offset + torch.arange(4, device=cache.device)] = scale_bytes


def read_token(cache, block, offset):
    """Token (block, offset) from the cache bytes, as float64 (values, scale)."""
    block_size = cache.shape[1]
    flat = cache.view(cache.shape[0], -1)
    values = flat[block, offset * DIM : (offset + 1) * DIM].view(FP8).double()
    at = block_size * DIM + 4 * offset
    return values, flat[block, at : at + 4].view(torch.float32).double().item()


def logit(q_row, weights_row, k, scale):
    """sum_h w_h * relu((q_h . k) * scale), head by head in float64."""
    total = 0.0
    for h in range(q_row.shape[0]):
        total += float(weights_row[h]) * max(0.0, float(q_row[h].double() @ k) * scale)
    return total


def naive_ragged(q, k, k_scale, weights, starts, ends, width=None):
    rows, n = q.shape[0], k.shape[0]
    out = torch.full((rows, n if width is None else width), -math.inf, dtype=torch.float64)
    for t in range(rows):
        for s in range(max(0, int(starts[t])), min(n, int(ends[t]))):
            column = s if width is None else s - int(starts[t])
            if column < out.shape[1]:
                out[t, column] = logit(q[t], weights[t], k[s].double(), float(k_scale[s]))
    return out


def naive_paged(q, cache, weights, ends, block_table, width):
    """Row (b, j) over positions [0, ends[b][j]), each read through the block table from the bytes."""
    batch, next_n = q.shape[:2]
    block_size = cache.shape[1]
    out = torch.full((batch * next_n, width), -math.inf, dtype=torch.float64)
    for b in range(batch):
        for j in range(next_n):
            for s in range(ends[b][j]):
                values, scale = read_token(cache, int(block_table[b, s // block_size]), s % block_size)
                out[b * next_n + j, s] = logit(q[b, j], weights[b * next_n + j], values, scale)
    return out


def assert_logits_match(got, want):
    """The same -inf pattern exactly; finite logits to fp32's rounding of a 128-term dot product."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(torch.isneginf(got), torch.isneginf(want)), "masks differ"
    finite = torch.isfinite(want)
    assert torch.isfinite(got[finite]).all()
    size = want[finite].abs().max().item() if finite.any() else 1.0
    torch.testing.assert_close(got[finite].double(), want[finite], rtol=1e-5, atol=1e-6 * size)


def ragged_case(seed, rows=6, n=40, heads=HEADS):
    gen = torch.Generator().manual_seed(seed)
    q = away_from_zero(gen, rows, heads, DIM, scale=50.0).to(FP8)
    k, k_scale = quantize_tokens(away_from_zero(gen, n, DIM))
    weights = away_from_zero(gen, rows, heads, scale=1e-2)
    for x in (q.float(), k.float(), weights):
        assert torch.isfinite(x).all() and (x != 0).all()
    return q, k, k_scale, weights


# Prefill rows: causal ranges of two requests, an empty row, a range ending at N, a range of one.
STARTS = torch.tensor([0, 0, 0, 12, 12, 39], dtype=torch.int32)
ENDS = torch.tensor([5, 12, 0, 40, 20, 40], dtype=torch.int32)


def paged_case(seed, lens, next_n, block_size=4, num_blocks=40, ue8m0=False, heads=HEADS):
    """Requests of lengths ``lens`` in shuffled blocks of a cache whose other bytes are random (NaN
    patterns included); table entries past each request's blocks are junk (-1, out of range, or another
    request's block)."""
    gen = torch.Generator().manual_seed(seed)
    cache = torch.randint(0, 256, (num_blocks, block_size, 1, DIM + 4), generator=gen, dtype=torch.uint8)
    max_blocks = max(-(-n // block_size) for n in lens) + 2
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    table = torch.tensor([[-1, 10**6, pool[-1]][i % 3] for i in range(len(lens) * max_blocks)], dtype=torch.int32)
    table = table.view(len(lens), max_blocks)
    for b, n in enumerate(lens):
        used = -(-n // block_size)
        table[b, :used] = torch.tensor([pool.pop() for _ in range(used)], dtype=torch.int32)
        values, scales = quantize_tokens(away_from_zero(gen, n, DIM), ue8m0)
        positions = torch.arange(n)
        slots = table[b, positions // block_size].long() * block_size + positions % block_size
        write_cache(cache, values, scales, slots)
    q = away_from_zero(gen, len(lens), next_n, heads, DIM, scale=50.0).to(FP8)
    weights = away_from_zero(gen, len(lens) * next_n, heads, scale=1e-2)
    assert torch.isfinite(q.float()).all() and (q.float() != 0).all() and (weights != 0).all()
    return q, cache, weights, table


def causal_ends(lens, next_n):
    """DeepGEMM's 1-D rule: draft token j of a request of length L scores [0, L - next_n + j + 1)."""
    return [[max(0, n - next_n + j + 1) for j in range(next_n)] for n in lens]


LENS = [9, 1, 0, 23]  # a request of 0: a padding row, all -inf


def reference_paged64(q, cache, weights, ends, block_table, width):
    """naive_paged, vectorised (for sizes the loop cannot reach): every position through the table,
    float64 products, heads summed after the relu; -inf at and past each row's end."""
    batch, next_n, heads, _ = q.shape
    block_size = cache.shape[1]
    ends = torch.as_tensor(ends, device=q.device).reshape(batch, next_n)
    positions = torch.arange(width, device=q.device)
    blocks = block_table[:, (positions // block_size).clamp(max=block_table.shape[1] - 1)].long().clamp(min=0)
    blocks = blocks.clamp(max=cache.shape[0] - 1)
    flat = cache.view(cache.shape[0], -1)
    offset = (positions % block_size)[None, :]
    values = flat[blocks[..., None], offset[..., None] * DIM + torch.arange(DIM, device=q.device)]
    scale_at = block_size * DIM + 4 * offset[..., None] + torch.arange(4, device=q.device)
    scales = flat[blocks[..., None], scale_at].contiguous().view(torch.float32)[..., 0].double()
    dots = torch.einsum("bjhd,bsd->bjhs", q.double(), values.view(FP8).double()) * scales[:, None, None, :]
    logits = (dots.relu() * weights.double().view(batch, next_n, heads, 1)).sum(dim=2)
    logits = torch.where(positions < ends[..., None], logits, -math.inf)
    return logits.reshape(batch * next_n, width)
