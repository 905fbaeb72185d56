"""An independent float64 oracle for paged MLA decode, for tests.

A naive loop: each request's keys gathered token by token through the block table, each (token,
head) row's softmax written out with math.exp. It shares no code with mla_backend.reference (the
vectorised reference the CPU op runs), so a plumbing or scaling error in either shows up.
"""

from __future__ import annotations

import math

import torch

# The op's CPU path rounds a float64 result once: to bf16 (8 significant bits) for out, to float32 for LSE.
BF16_ROUNDING = 2.0**-8
FP32_ROUNDING = 2.0**-22


def naive_decode(query, kv_cache, block_tables, seq_lens, bmm1: float, bmm2: float, causal: bool = True):
    """(out [B, q_len, H, 512], lse [B, q_len, H]) in float64; a row that sees no key: zeros, -inf."""
    q = query.double()
    cache = kv_cache.reshape(-1, kv_cache.shape[-2], 576).double()
    page = cache.shape[1]
    batch, q_len, heads, _ = q.shape
    out = torch.zeros(batch, q_len, heads, 512, dtype=torch.float64)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=torch.float64)
    for b in range(batch):
        n = int(seq_lens[b])
        rows = [cache[int(block_tables[b, pos // page]), pos % page] for pos in range(n)]
        for t in range(q_len):
            visible = n - q_len + t + 1 if causal else n  # causal: token t sees the keys up to its own position
            for h in range(heads):
                if visible <= 0:
                    continue
                logits = [float(q[b, t, h] @ rows[p]) * bmm1 for p in range(visible)]
                m = max(logits)
                weights = [math.exp(x - m) for x in logits]
                total = sum(weights)
                acc = sum(w * rows[p][:512] for p, w in enumerate(weights))
                out[b, t, h] = acc / total * bmm2
                lse[b, t, h] = m + math.log(total)
    return out, lse


def naive_decode_problem(problem, bmm1: float, bmm2: float, causal: bool = True):
    return naive_decode(problem.query, problem.kv_cache, problem.block_tables, problem.seq_lens, bmm1, bmm2, causal)


def assert_rounded_from(
    out: torch.Tensor, lse: torch.Tensor | None, want_out: torch.Tensor, want_lse: torch.Tensor | None
) -> None:
    """out (bf16) and lse (fp32) are the oracle's float64 values rounded once: tight, not kernel tolerances."""
    torch.testing.assert_close(out.double(), want_out.reshape(out.shape), rtol=BF16_ROUNDING, atol=0.0)
    if lse is not None:
        want_lse = want_lse.reshape(lse.shape)
        assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
        finite = torch.isfinite(want_lse)
        torch.testing.assert_close(lse.double()[finite], want_lse[finite], rtol=FP32_ROUNDING, atol=1e-30)
