"""`python -m mla_backend bench --sparse`: sparse MLA decode (top-k 2048 over an fp8_ds_mla cache, vLLM's
DeepSeek-V3.2 layout) timed against FlashMLA's sparse decode where the engine ships it (vLLM on SM90),
in one run, by CUDA-graph replay over problem copies past L2.

FlashMLA's sparse decode takes 64 or 128 heads; vLLM pads fewer heads to 64, so that is what it is
timed at (its padded heads cost it time, as they do in vLLM). TFLOP/s count the useful work of the
real heads: 2 x heads x listed rows x (576 + 512) a query token.
"""

from __future__ import annotations

import torch

from ..sparse import sparse_mla_decode
from ..sparse_problems import make_sparse_case
from .bench import copies_past_l2, time_graph

TOPK = 2048
# (heads, query tokens): V3.2 at TP8 (16) and GLM-5 at TP8 (8) decode, a batch of MTP drafts, and the
# full-head shapes FlashMLA's own perf cases time (128 heads, 2 tokens a request).
SHAPES = [(8, 32), (16, 1), (16, 64), (16, 256), (64, 64), (128, 16), (128, 128), (128, 256)]


def flashmla_call(case, heads: int):
    """FlashMLA's sparse decode (vLLM 0.26's ops) of the case, heads padded to 64 or 128; None where
    it is not importable here."""
    try:
        from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache, get_mla_metadata
    except ImportError:
        return None
    padded = 64 if heads <= 64 else 128
    tokens = case.query.shape[0]
    query = torch.zeros(tokens, 1, padded, 576, dtype=torch.bfloat16, device="cuda")
    query[:, :, :heads] = case.query[:, None]
    cache = case.kv_cache.unsqueeze(-2)  # [pages, 64, 1, 656]
    indices = case.indices[:, None, :]
    meta, _ = get_mla_metadata()

    def call():
        flash_mla_with_kvcache(
            query, cache, None, None, 512, meta, softmax_scale=case.sm_scale, causal=False, is_fp8_kvcache=True,
            indices=indices,
        )  # fmt: skip

    call()  # FlashMLA plans on its first call, which must not be captured
    return call


def ours_call(case, workspace):
    out = torch.empty(case.query.shape[0], case.query.shape[1], 512, dtype=torch.bfloat16, device="cuda")
    return lambda: sparse_mla_decode(
        case.query, case.kv_cache, case.indices, case.sm_scale, out=out, workspace_buffer=workspace
    )


def time_shape(heads: int, tokens: int, workspace) -> dict[str, float | None]:
    """Median microseconds a call of ours and of FlashMLA (None: not available)."""
    kv_bytes = tokens * TOPK * 656
    copies = copies_past_l2(kv_bytes)
    cases = [
        make_sparse_case(tokens, heads, TOPK, "pow2_fp32", "cuda", seed=i, cache_tokens=tokens * TOPK, poison=False)
        for i in range(copies)
    ]
    times: dict[str, float | None] = {"ours": time_graph([ours_call(c, workspace) for c in cases])}
    peers = [flashmla_call(c, heads) for c in cases]
    times["flashmla"] = None if peers[0] is None else time_graph(peers)
    return times


def tflops(heads: int, tokens: int, us: float | None) -> float | None:
    return None if us is None else 2 * heads * tokens * TOPK * (576 + 512) / us / 1e6


def main() -> int:
    if not torch.cuda.is_available():
        print("bench needs a CUDA GPU")
        return 2
    workspace = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda")
    print(f"sparse MLA decode, top-k {TOPK}, fp8_ds_mla, on {torch.cuda.get_device_name()}: us per call")
    print(f"{'H':>4} {'T':>4} | {'ours':>8} {'TF/s':>6} | {'flashmla':>8} {'TF/s':>6} | {'ours/fm':>7}")
    for heads, tokens in SHAPES:
        t = time_shape(heads, tokens, workspace)
        ours, peer = t["ours"], t["flashmla"]
        peer_cells = f"{peer:>8.1f} {tflops(heads, tokens, peer):>6.1f}" if peer else f"{'-':>8} {'-':>6}"
        ratio = f"{ours / peer:>7.3f}" if ours and peer else f"{'-':>7}"
        print(
            f"{heads:>4} {tokens:>4} | {ours:>8.1f} {tflops(heads, tokens, ours):>6.1f} | {peer_cells} | {ratio}",
            flush=True,
        )
        torch.cuda.empty_cache()
    return 0
