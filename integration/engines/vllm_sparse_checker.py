"""Checks a vLLM engine's sparse MLA calls and its indexer's top-k in float64, as they happen
(judges/sparse_check.py): in the engine's process (an in-process engine, or a server's engine core
through vllm_worker_check.py). Calls it sees are the eager ones: all of an eager engine's, and a
graph-captured engine's mixed (prefill) batches; replayed decode steps never reach Python.

Wraps, for one engine run: a sparse impl's ``forward_mqa`` (ours, or one of vLLM's SM90 pair named by
``backend``, whose calls take the same metadata; every call after ``arm()``: its query,
the top-k lists the indexer left in the shared buffer, each token's request, the block table, the
cache as it is at the call, the output) and, from ``arm()``, the indexer's decode scorer as vLLM's
DeepGEMM wrapper holds it (the plugin's where DeepGEMM is missing), whose fp8 inputs are recomputed
in float64. A decode-only step's lists are judged against the float64 top-k of the scorer call that
preceded them in the same layer.
``corrupt`` scales every output (the selftest: the attention check must then fail).
"""

from __future__ import annotations

import importlib
from collections import Counter

import torch

from integration.judges.sparse_check import (
    SparseCall,
    boundary_near_ties,
    check_sparse_call,
    indexer_logits64,
    paged_index_keys,
    topk_problems,
)
from mla_backend.reference import ROW_ERROR_TOLERANCE

# The sparse impls a checker wraps, by attention backend: ours, and vLLM's two SM90 sparse backends (the
# references, checked as ours is to tell where two runs part which of them is off).
IMPLS = {
    "CUSTOM": ("mla_backend.vllm.sparse_backend", "MLASparseImpl"),
    "FLASHMLA_SPARSE": ("vllm.v1.attention.backends.mla.flashmla_sparse", "FlashMLASparseImpl"),
    "FLASH_ATTN_MLA_SPARSE": ("vllm.v1.attention.backends.mla.flashattn_mla_sparse", "FlashAttnMLASparseImpl"),
}


class SparseChecker:
    def __init__(
        self,
        kv_dtype: torch.dtype,
        max_calls: int = 24,
        max_topk_checks: int = 24,
        corrupt=None,
        backend: str = "CUSTOM",
    ):
        if backend not in IMPLS:
            raise ValueError(f"no sparse impl to check for backend {backend!r}; one of {sorted(IMPLS)}")
        self.backend = backend
        self.kv_dtype = kv_dtype
        self.max_calls = max_calls
        self.max_topk_checks = max_topk_checks
        self.corrupt = corrupt
        self.armed = False
        self.calls: Counter = Counter()  # real calls by kind (decode / mixed)
        self.checks: list[dict] = []
        self.topk_checks: list[dict] = []
        self.problems: set[str] = set()
        self._scored: list[tuple[torch.Tensor, list[int]]] = []  # float64 decode logits since the last call
        self._restore: list = []
        self.scorer = ""  # whose decode logits the indexer used: mla_backend's or DeepGEMM's

    def __enter__(self):
        module, name = IMPLS[self.backend]
        impl_class = getattr(importlib.import_module(module), name)
        checker = self
        forward = impl_class.forward_mqa

        def forward_mqa(impl, q, kv_cache, metadata, layer):
            out, lse = forward(impl, q, kv_cache, metadata, layer)
            if checker.corrupt is not None:
                out.mul_(checker.corrupt)
            try:
                checker.record(impl, q, kv_cache, metadata, out, lse)
            except Exception as err:  # a checker problem is reported, never hidden
                checker.problems.add(repr(err)[:300])
            return out, lse

        self._restore = [(impl_class, "forward_mqa", forward)]
        impl_class.forward_mqa = forward_mqa
        return self

    def wrap_scorer(self) -> None:
        """Wrap the decode scorer vLLM's DeepGEMM wrapper calls, once vLLM has initialised it (its
        start-up runs the indexer): DeepGEMM's where it runs, else the one the plugin installed."""
        import vllm.utils.deep_gemm as deep_gemm

        from mla_backend import indexer

        name = "_fp8_fp4_paged_mqa_logits_impl"
        deep_gemm._lazy_init()  # what the wrapper does at its first call (start-up may not have made one)
        paged = getattr(deep_gemm, name, None)
        if paged is None:
            self.problems.add("vLLM's decode scorer of the indexer is not set after start-up")
            return
        self.scorer = "mla_backend" if paged is indexer.fp8_fp4_paged_mqa_logits else getattr(paged, "__module__", "?")
        paged_logits = self.scoring_through(paged)
        self._restore.append((deep_gemm, name, paged))
        setattr(deep_gemm, name, paged_logits)

    def __exit__(self, *exc):
        for owner, name, original in self._restore:
            setattr(owner, name, original)

    def arm(self) -> None:
        """The engine has started: calls from now on carry real tokens."""
        self.wrap_scorer()
        self.armed = True
        self._scored.clear()

    def after_step(self) -> None:
        """vllm_worker_check's hook after each engine step: every call is judged as it comes."""

    def scoring_through(self, paged):
        """The decode scorer ``paged`` wrapped so that each call's inputs are also scored here (a failure
        here is the run's problem, never the engine's)."""

        def paged_logits(q, kv_cache, weights, context_lens, block_table, *args, **kwargs):
            logits = paged(q, kv_cache, weights, context_lens, block_table, *args, **kwargs)
            try:
                self.score(q, kv_cache, weights, context_lens, block_table)
            except Exception as err:
                self.problems.add(repr(err)[:300])
            return logits

        return paged_logits

    def check_topk(self, chosen: torch.Tensor, logits: torch.Tensor, lengths: list[int]) -> None:
        """A decode step's lists ``chosen`` [R, K] (positions in each row's request, -1 for none) against
        the logits its scorer call gave: a top-k up to ties, and the rows whose choice rests on a near-tie."""
        k = chosen.shape[1]
        problems = topk_problems(chosen, logits, lengths, k)
        selecting, ties = boundary_near_ties(logits, lengths, k)
        self.topk_checks.append(
            {"rows": chosen.shape[0], "problems": problems[:3], "selecting": selecting, "ties": ties}
        )

    def score(self, q, kv_cache, weights, context_lens, block_table) -> None:
        """The float64 logits of a decode scorer call, row (b, j) for draft token j of request b (one row
        a request without drafts), scoring positions [0, end): end = context_lens[b, j] for vLLM's 2-D
        lengths, L - next_n + j + 1 for 1-D ones (DeepGEMM's two forms)."""
        if not self.armed or len(self.topk_checks) >= self.max_topk_checks:
            return
        values = q[0] if isinstance(q, tuple) else q
        batch, next_n, heads, dim = values.shape
        if context_lens.dim() == 2:
            ends = context_lens.expand(batch, next_n).tolist()
        else:
            ends = [[max(0, n - next_n + j + 1) for j in range(next_n)] for n in context_lens.tolist()]
        width = max((max(row) for row in ends), default=0)
        logits = torch.full((batch * next_n, width), float("-inf"), dtype=torch.float64, device=values.device)
        for b, row_ends in enumerate(ends):
            if max(row_ends) == 0:
                continue  # a padding request: its rows score nothing
            keys, scales = paged_index_keys(kv_cache, block_table[b], max(row_ends), dim)
            rows = indexer_logits64(values[b], keys, scales, weights[b * next_n : (b + 1) * next_n])
            for j, end in enumerate(row_ends):
                logits[b * next_n + j, :end] = rows[j, :end]
        self._scored.append((logits, [end for row_ends in ends for end in row_ends]))

    def record(self, impl, q, kv_cache, metadata, out, lse) -> None:
        scored, self._scored = self._scored, []
        if not self.armed:
            return
        query = torch.cat(q, dim=-1) if isinstance(q, tuple) else q
        tokens = query.shape[0]
        kind = "decode" if metadata.num_prefills == 0 else "mixed"
        self.calls[kind] += 1
        topk = impl.topk_indices_buffer[:tokens]
        if kind == "decode" and len(scored) == 1 and scored[0][0].shape[0] == tokens:
            logits, lengths = scored[0]
            self.check_topk(topk, logits, lengths)
        if sum(self.calls.values()) > self.max_calls and kind == "decode":
            return  # every mixed call is checked (few); decode calls up to max_calls
        call = SparseCall(
            query=query,
            topk=topk,
            req_ids=metadata.req_id_per_token[:tokens],
            block_table=metadata.block_table,
            block_size=metadata.block_size,
            kv_cache=kv_cache,
            scale=impl.scale,
            out=out,
            lse=lse,
        )
        result = check_sparse_call(call)
        self.checks.append({"kind": kind, "tokens": tokens, **result.__dict__})

    def summary(self) -> dict:
        tolerance = ROW_ERROR_TOLERANCE[self.kv_dtype]
        worst = max((c["out_error"] for c in self.checks), default=None)
        rows = sum(c["rows"] for c in self.checks)
        topk_bad = [c for c in self.topk_checks if c["problems"]]
        ok = (
            rows > 0
            and worst is not None
            and worst <= tolerance
            and all(c["lse_ok"] for c in self.checks)
            and (bool(self.topk_checks) or self.calls["decode"] == 0)  # eager decode steps: their lists judged
            and not topk_bad
            and not self.problems
        )
        return {
            "ok": ok,
            "calls": dict(self.calls),
            "checked_calls": len(self.checks),
            "checked_rows": rows,
            "mixed_calls_checked": sum(c["kind"] == "mixed" for c in self.checks),
            "worst_row_error": worst,
            "worst_row_error_by_kind": {
                kind: max(c["out_error"] for c in self.checks if c["kind"] == kind)
                for kind in sorted({c["kind"] for c in self.checks})
            },
            "tolerance": tolerance,
            "backend": self.backend,
            "indexer_scorer": self.scorer,
            "topk_checked_rows": sum(c["rows"] for c in self.topk_checks),
            "topk_selecting_rows": sum(c["selecting"] for c in self.topk_checks),
            "topk_boundary_ties": sum(c["ties"] for c in self.topk_checks),
            "topk_failures": [c["problems"] for c in topk_bad][:3],
            "problems": sorted(self.problems),
        }


__all__ = ["SparseChecker"]
