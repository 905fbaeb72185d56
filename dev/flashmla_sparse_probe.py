"""Probe: FlashMLA's sparse FP8 decode (vLLM 0.26's ops) against float64, beside ours, on random cases:
each token's worst relative L2 row error, for query layouts [1, T] (one batch of T tokens, as vLLM's
mixed-batch path sends them) and [T, 1]; a prompt's tokens in one call; rows past 2**31 bytes."""

import torch
from flashmla_sparse_precision import flashmla  # the same call (dev/ is the script's path)

from mla_backend.reference import sparse_mla_reference
from mla_backend.sparse import sparse_mla_decode
from mla_backend.sparse_problems import make_sparse_case


def row_error(got, want):
    got, want = got.double(), want.double()
    return float(((got - want).norm(dim=-1) / want.norm(dim=-1).clamp_min(1e-30)).max())


def main():
    print(f"{'kind':>15} {'H':>4} {'T':>4} {'sharp':>5} | {'fm [1,T]':>9} {'fm [T,1]':>9} {'ours':>9}")
    for kind in ("arbitrary_fp32", "pow2_fp32"):
        for heads, tokens in ((64, 1), (64, 4), (64, 64), (64, 130), (128, 16)):
            for sharp in (1.0, 8.0):
                case = make_sparse_case(tokens, heads, 2048, kind, "cuda", seed=tokens + heads, poison=False)
                query = (case.query.float() * sharp).to(torch.bfloat16)
                want, _ = sparse_mla_reference(query, case.kv_rows.to("cuda"), case.indices, case.sm_scale)
                out, _ = flashmla(query, case.kv_cache, case.indices, scale=case.sm_scale)
                out2, _ = flashmla(query, case.kv_cache, case.indices, layout="Tx1", scale=case.sm_scale)
                ours = sparse_mla_decode(query, case.kv_cache, case.indices, case.sm_scale)
                torch.cuda.synchronize()
                print(
                    f"{kind:>15} {heads:>4} {tokens:>4} {sharp:>5} | {row_error(out, want):9.2e} "
                    f"{row_error(out2, want):9.2e} {row_error(ours, want):9.2e}"
                )


def prefill_like():
    """A prompt's tokens in one call, as a mixed step sends them: token t lists min(t + 1, 2048) ids,
    the rest -1."""
    for tokens in (300, 3000, 12000):
        case = make_sparse_case(tokens, 64, 2048, "arbitrary_fp32", "cuda", seed=tokens, poison=False)
        lens = torch.arange(1, tokens + 1, device="cuda").clamp(max=2048)
        indices = case.indices.clone()
        indices[torch.arange(2048, device="cuda")[None, :] >= lens[:, None]] = -1
        want, _ = sparse_mla_reference(case.query, case.kv_rows.to("cuda"), indices, case.sm_scale)
        out, _ = flashmla(case.query, case.kv_cache, indices, scale=case.sm_scale)
        ours = sparse_mla_decode(case.query, case.kv_cache, indices, case.sm_scale)
        torch.cuda.synchronize()
        fm_rows = ((out.double() - want).norm(dim=-1) / want.norm(dim=-1)).amax(-1)
        worst = int(fm_rows.argmax())
        print(
            f"prefill-like T={tokens}: flashmla {float(fm_rows.max()):.2e} (token {worst}, {int(lens[worst])} ids), "
            f"ours {row_error(ours, want):.2e}; flashmla rows over 2e-2: {int((fm_rows > 2e-2).sum())}"
        )


def far_rows():
    """The same lists over rows placed past 2**31 bytes into the cache (an engine's cache is GBs a layer)."""
    for tokens in (64, 12000):
        case = make_sparse_case(tokens, 64, 2048, "arbitrary_fp32", "cuda", seed=tokens, poison=False)
        near = case.kv_cache.shape[0] * 64
        shift = ((3 << 31) // 656 // 64) * 64  # whole pages, about 6 GiB in
        cache = torch.empty(shift + near, 656, dtype=torch.uint8, device="cuda")
        cache[shift:] = case.kv_cache.view(-1, 656)
        want, _ = sparse_mla_reference(case.query, case.kv_rows.to("cuda"), case.indices, case.sm_scale)
        pages = cache.view(-1, 64, 656)
        out, _ = flashmla(case.query, pages, case.indices + shift, scale=case.sm_scale)
        ours = sparse_mla_decode(case.query, pages, case.indices + shift, case.sm_scale)
        torch.cuda.synchronize()
        print(f"far rows T={tokens}: flashmla {row_error(out, want):.2e}, ours {row_error(ours, want):.2e}")
        del cache


if __name__ == "__main__":
    main()
    prefill_like()
    far_rows()
