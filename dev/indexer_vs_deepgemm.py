"""Probe: DeepGEMM's indexer logits (what vLLM 0.26's DSA indexer calls on SM90) against ours
(mla_backend.indexer, same arguments), at DeepSeek-V3.2's shape: 64 index heads x 128 (INDEXER_HEADS=32:
GLM-5's), pages of 64, an fp8 index cache of 132 bytes a token (128 e4m3 values, one fp32 scale).

Error: both against float64 on random inputs, per row the worst |got - float64| over the row's scored
positions as a fraction of the row's largest |logit|, worst row shown. Self-check: the same with one page
of each request's scales doubled in the inputs the kernels read (float64 keeps the clean ones) must come
out large, or the comparison could not fail. Time: decode by CUDA-graph replay of a run of calls over
caches past L2 (median, as dev/indexer_cost.py), prefill (causal rows, ragged K) by CUDA events.
Run on the GPU after ``bash dev/install_deepgemm_on_gpu.sh && source /tmp/site/env.sh``, from the repo
root: ``PYTHONPATH=.:tests python3 dev/indexer_vs_deepgemm.py`` (deep_gemm from $PYTHONPATH, else from
$DEEPGEMM_SITE, default /tmp/site). ``--keys-major`` adds ours at other tiles (mla_backend.indexer_triton's
KEYS_MAJOR, ROW_TARGET, KEY_BLOCK): rows-major, and keys-major at a few sizes, measured the same way.
Exits 1 if a check fails."""

import importlib
import os
import statistics
import sys

import torch
from indexer_cases import away_from_zero, quantize_tokens, reference_paged64, write_cache

from mla_backend import indexer
from mla_backend.tools.bench import copies_past_l2, time_graph

HEADS, DIM, PAGE = int(os.environ.get("INDEXER_HEADS", 64)), 128, 64
TOKEN_BYTES = DIM + 4
TOL, CORRUPT_MIN = 1e-2, 0.1  # clean error must be below TOL, corrupted above CORRUPT_MIN
DECODE = ((1, 4096), (8, 4096), (32, 4096), (32, 16384), (32, 32768))
PREFILL = ((2048, 2048), (2048, 16384))
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count
try:
    deep_gemm = importlib.import_module("deep_gemm")
except ImportError:  # PYTHONPATH=.:tests drops the env file's site dir: look there
    sys.path.append(os.environ.get("DEEPGEMM_SITE", "/tmp/site"))
    deep_gemm = importlib.import_module("deep_gemm")


def dg_paged(q, cache, weights, lens, table, meta, width):
    return deep_gemm.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, meta, width, clean_logits=False)


def our_paged(q, cache, weights, lens, table, meta, width):
    return indexer.fp8_fp4_paged_mqa_logits((q, None), cache, weights, lens, table, meta, width, clean_logits=False)


def dg_ragged(q, k, scales, weights, starts, ends):
    return deep_gemm.fp8_fp4_mqa_logits((q, None), (k, scales), weights, starts, ends, clean_logits=False)


def our_ragged(q, k, scales, weights, starts, ends):
    return indexer.fp8_fp4_mqa_logits((q, None), (k, scales), weights, starts, ends, clean_logits=False)


def tiled(paged, ragged, keys_major, row_target, key_block):
    """Ours with mla_backend.indexer_triton's tiles of ``row_target`` (token, head) pairs by ``key_block``
    prefill keys, keys-major or not, set for each call (a graph captured around it keeps them)."""
    from mla_backend import indexer_triton

    def wrap(fn):
        def call(*args):
            shipped = indexer_triton.KEYS_MAJOR, indexer_triton.ROW_TARGET, indexer_triton.KEY_BLOCK
            indexer_triton.KEYS_MAJOR, indexer_triton.ROW_TARGET, indexer_triton.KEY_BLOCK = (
                keys_major,
                row_target,
                key_block,
            )
            try:
                return fn(*args)
            finally:
                indexer_triton.KEYS_MAJOR, indexer_triton.ROW_TARGET, indexer_triton.KEY_BLOCK = shipped

        return call

    return wrap(paged), wrap(ragged)


IMPLS = {"DeepGEMM": (dg_paged, dg_ragged), "ours": (our_paged, our_ragged)}
# (keys-major, (token, head) pairs, prefill keys) a program holds
TILES = ((False, 128, 64), (True, 128, 64), (True, 256, 64), (True, 128, 128), (True, 256, 128))


def row_error(got, want):
    """Worst row of max |got - want| / max |want| over want's finite (scored) positions; NaN counts as inf."""
    got = got[:, : want.shape[1]].double()
    finite = torch.isfinite(want)
    diff = torch.nan_to_num(torch.where(finite, got - want, 0).abs(), nan=float("inf"), posinf=float("inf"))
    size = torch.where(finite, want, 0).abs().amax(dim=1).clamp(min=1e-30)
    return (diff.amax(dim=1) / size)[finite.any(dim=1)].max().item()


def paged_case(batch=8, width=8192, seed=0):
    """Requests of random lengths (one full) in shuffled pages; q and k quantised as vLLM does."""
    gen = torch.Generator().manual_seed(seed)
    blocks = batch * width // PAGE
    cache = torch.zeros(blocks, PAGE, 1, TOKEN_BYTES, dtype=torch.uint8)
    table = torch.randperm(blocks, generator=gen).view(batch, -1).to(torch.int32)
    lens = torch.randint(1, width + 1, (batch, 1), generator=gen, dtype=torch.int32)
    lens[0] = width
    values, scales = quantize_tokens(torch.randn(batch * width, DIM, generator=gen))
    positions, requests = torch.arange(width).repeat(batch), torch.arange(batch).repeat_interleave(width)
    write_cache(cache, values, scales, table[requests, positions // PAGE].long() * PAGE + positions % PAGE)
    q = quantize_tokens(torch.randn(batch * HEADS, DIM, generator=gen))[0].view(batch, 1, HEADS, DIM)
    weights = away_from_zero(gen, batch, HEADS, scale=HEADS**-0.5)
    return [t.cuda() for t in (q, cache, weights, lens, table)]


def ragged_case(rows=512, keys=4096, seed=1):
    gen = torch.Generator().manual_seed(seed)
    q = quantize_tokens(torch.randn(rows * HEADS, DIM, generator=gen))[0].view(rows, HEADS, DIM)
    k, scales = quantize_tokens(torch.randn(keys, DIM, generator=gen))
    weights = away_from_zero(gen, rows, HEADS, scale=HEADS**-0.5)
    ends = torch.arange(keys - rows + 1, keys + 1, dtype=torch.int32)  # causal rows at the end
    return [t.cuda() for t in (q, k, scales, weights, torch.zeros_like(ends), ends)]


def reference_ragged64(q, k, scales, weights, starts, ends):
    dots = torch.einsum("mhd,nd->mhn", q.double(), k.double()) * scales.double()
    logits = (dots.relu() * weights.double()[..., None]).sum(dim=1)
    cols = torch.arange(k.shape[0], device=k.device)
    return torch.where((cols >= starts[:, None]) & (cols < ends[:, None]), logits, float("-inf"))


def accuracy():
    """{(case, impl): (clean error, corrupted error)}."""
    out = {}
    q, cache, weights, lens, table = paged_case()
    width = cache.shape[0] * PAGE // q.shape[0]
    want = reference_paged64(q, cache, weights, lens, table, width)
    bad = cache.clone()
    bad.view(bad.shape[0], -1)[:, PAGE * DIM :].view(torch.float32)[table[:, 0].long()] *= 2
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, PAGE, NUM_SMS)
    for name, (fn, _) in IMPLS.items():
        errors = [row_error(fn(q, c, weights, lens, table, meta, width), want) for c in (cache, bad)]
        out["paged B8 ctx<=8192", name] = tuple(errors)
    q, k, scales, weights, starts, ends = ragged_case()
    want = reference_ragged64(q, k, scales, weights, starts, ends)
    bad = scales.clone()
    bad[:PAGE] *= 2
    for name, (_, fn) in IMPLS.items():
        errors = [row_error(fn(q, k, s, weights, starts, ends), want) for s in (scales, bad)]
        out["ragged 512 x 4096", name] = tuple(errors)
    return out


def decode_problem(batch, width):
    blocks = batch * width // PAGE
    cache = torch.randint(0, 120, (blocks, PAGE, 1, TOKEN_BYTES), dtype=torch.uint8, device="cuda")
    cache.view(blocks, -1)[:, PAGE * DIM :] = torch.rand(blocks, PAGE, device="cuda").view(torch.uint8)
    q = torch.randn(batch, 1, HEADS, DIM, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.rand(batch, HEADS, device="cuda")
    table = torch.randperm(blocks, device="cuda", dtype=torch.int32).view(batch, -1)
    return q, cache, weights, table


def decode_us(fn, batch, context):
    """Per call, over one graph of as many calls (each its own cache) as keep the caches past L2."""
    lens = torch.full((batch, 1), context, dtype=torch.int32, device="cuda")
    meta = deep_gemm.get_paged_mqa_logits_metadata(lens, PAGE, NUM_SMS)  # once a step in vLLM, not timed
    problems = [decode_problem(batch, context) for _ in range(copies_past_l2(batch * context * TOKEN_BYTES))]

    def call(q, cache, weights, table):
        return lambda: fn(q, cache, weights, lens, table, meta, context)

    return time_graph([call(*p) for p in problems], replays=7, warmup_s=0.2)


def prefill_us(fn, rows, keys):
    q = torch.randn(rows, HEADS, DIM, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(keys, DIM, device="cuda").to(torch.float8_e4m3fn)
    scales, weights = torch.rand(keys, device="cuda"), torch.rand(rows, HEADS, device="cuda")
    ends = torch.arange(keys - rows + 1, keys + 1, device="cuda", dtype=torch.int32)
    starts = torch.zeros_like(ends)
    times = []
    for _ in range(6):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(q, k, scales, weights, starts, ends)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times[1:])


def main() -> int:
    if "--keys-major" in sys.argv[1:]:
        for keys_major, pairs, keys in TILES:
            name = f"{'km' if keys_major else 'rows'} {pairs}x{keys}"
            IMPLS[name] = tiled(our_paged, our_ragged, keys_major, pairs, keys)
    print(f"{torch.cuda.get_device_name()} ({NUM_SMS} SMs) | deep_gemm {deep_gemm.__version__} {deep_gemm.__file__}")
    print(f"{HEADS} index heads x {DIM}, pages of {PAGE}")
    errors = accuracy()
    failed = [key for key, (clean, bad) in errors.items() if not (clean < TOL and bad > CORRUPT_MIN)]
    times = []  # (case, bytes read, {impl: us})
    for batch, context in DECODE:
        per_impl = {name: decode_us(paged, batch, context) for name, (paged, _) in IMPLS.items()}
        times.append((f"decode B{batch} ctx {context}", batch * context * TOKEN_BYTES, per_impl))
        print(f"  {times[-1][0]}: " + ", ".join(f"{n} {us:.1f} us" for n, us in per_impl.items()), flush=True)
    for rows, keys in PREFILL:
        per_impl = {name: prefill_us(ragged, rows, keys) for name, (_, ragged) in IMPLS.items()}
        times.append((f"prefill {rows} x {keys}", 0, per_impl))
        print(f"  {times[-1][0]}: " + ", ".join(f"{n} {us:.1f} us" for n, us in per_impl.items()), flush=True)
    print(f"\nerror vs float64 (worst row, / row max |logit|; ok < {TOL:g}, corrupted scale must be > {CORRUPT_MIN:g})")
    print(f"{'case':22} {'impl':12} {'clean':>9} {'corrupted':>10}  verdict")
    for (case, impl), (clean, bad) in errors.items():
        verdict = "FAIL" if (case, impl) in failed else "ok"
        print(f"{case:22} {impl:12} {clean:9.2e} {bad:10.2e}  {verdict}")
    print("\ntime per layer, us (GB/s of the index cache read), and each / DeepGEMM's")
    print(f"{'case':26} " + " ".join(f"{name:>20}" for name in IMPLS))
    for name, nbytes, per_impl in times:
        base = per_impl["DeepGEMM"]
        cells = [
            f"{us:.1f}" + (f" ({nbytes / us / 1e3:.0f})" if nbytes else "") + f" {us / base:.2f}x"
            for us in per_impl.values()
        ]
        print(f"{name:26} " + " ".join(f"{cell:>20}" for cell in cells))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
