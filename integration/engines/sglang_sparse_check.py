"""Checks SGLang's DSA decode calls that mla_backend serves (``--dsa-decode-backend mla_backend``), in
eager mode and in the scheduler process, with the vLLM sparse check's judges (judges/sparse_check.py):

- attention: every call of our DSA subclass's ``mla_attend`` (its query, the layer's KV pool buffer as
  it is at the call, the cache rows SGLang's index map gave each token, the output) recomputed in
  float64 over exactly those rows (check_sparse_slots; fp8_ds_mla rows dequantised exactly);
- indexer: SGLang's decode scorer (its ``deep_gemm.fp8_paged_mqa_logits``: on 0.5.17 the module global
  of its indexer module, where mla_backend's shim stands when DeepGEMM is missing; on 0.5.23 what its
  resolver returns) recomputed in float64 from its fp8 inputs; the next attention call's rows, turned
  back into positions through the scorer's page table, must be a top-k of those logits (topk_problems).
  SGLang's models here set neither ``index_init_tokens`` nor ``index_local_tokens``, which would force
  entries into the list past a plain top-k.

The bookkeeping and the summary are SparseChecker's (engines/vllm_sparse_checker.py), judged by
judge_sparse_check / judge_sparse_selftest; the summary's ``indexer_scorer`` names whose function scored.
Installed as sglang_decode_check.py installs the dense check: a test-only entry point (group
``sglang.srt.plugins``) that does nothing unless ENV is set; our subclass is wrapped when mla_backend's
plugin builds it (SGLang's first DSA backend), the scorer then too. The scheduler process writes its
summary after every call (process_summary's file name).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from integration.engines.entry_point_dir import entry_point_dir, path_with
from integration.engines.sglang_decode_check import process_summary, written_summaries
from integration.engines.vllm_sparse_checker import SparseChecker
from integration.judges.sparse_check import check_sparse_slots

ENV = "MLA_E2E_SPARSE_CHECK"  # {"corruption": float, "summary": path, "kv": "auto" | "fp8_e4m3"}
ENTRY_POINT = "integration.engines.sglang_sparse_check:install"
INDEXER_MODULE = "sglang.srt.layers.attention.dsa.dsa_indexer"
RESOLVER = "resolve_fp8_paged_mqa_logits_fn"  # 0.5.23
PAGE = 64  # SGLang's DSA page (its pool asserts it)


def plugin_env(root: Path, corruption: float, summary: Path, kv: str) -> dict:
    """The environment of an engine whose DSA decode calls are checked: the settings, and a PYTHONPATH
    that starts with the test-only entry point's directory."""
    settings = json.dumps({"corruption": corruption, "summary": str(summary), "kv": kv})
    entry = entry_point_dir(root, "sglang.srt.plugins", "mla_backend_e2e_sparse_check", ENTRY_POINT)
    return {ENV: settings, "PYTHONPATH": path_with(entry)}


def read_summary(summary: Path) -> dict | None:
    """The summary the scheduler process wrote (None where none was); one engine of one GPU has one
    scheduler, so a second file is a problem of the run, reported in the summary."""
    parts = [json.loads(p.read_text()) for p in written_summaries(summary)]
    if not parts:
        return None
    if len(parts) > 1:
        return {**parts[0], "ok": False, "problems": [*parts[0]["problems"], f"{len(parts)} processes checked"]}
    return parts[0]


def positions_of_slots(slots: torch.Tensor, page_table: torch.Tensor, lengths: list[int]) -> torch.Tensor:
    """[R, K] positions in each row's request of the cache rows ``slots`` [R, K] names (-1 stays -1),
    through the row's page table at SGLang's page of 64 (position p lives in row
    table[p // 64] * 64 + p % 64); a row found nowhere in the first ``lengths[r]`` positions becomes
    ``lengths[r]``, past the row, which topk_problems reports."""
    positions = torch.full_like(slots, -1, dtype=torch.long)
    for row, length in enumerate(lengths):
        chosen = slots[row].long()
        if length == 0:
            positions[row] = torch.where(chosen >= 0, 0, -1)
            continue
        at = torch.arange(length, device=slots.device)
        rows_of = page_table[row, at // PAGE].long() * PAGE + at % PAGE
        ordered, order = rows_of.sort()
        where = torch.searchsorted(ordered, chosen).clamp(max=length - 1)
        found = ordered[where] == chosen
        positions[row] = torch.where(chosen < 0, -1, torch.where(found, order[where], length))
    return positions


class SGLangSparseChecker(SparseChecker):
    """SparseChecker's bookkeeping over SGLang's DSA decode: ``attach`` wraps a DSA subclass of ours."""

    def __init__(self, kv_dtype: torch.dtype, sink: Path | None = None, corrupt: float | None = None):
        super().__init__(kv_dtype, max_calls=64, max_topk_checks=64, corrupt=corrupt)
        self.sink = sink
        self.armed = True  # eager engines: every call carries real tokens (no graph capture)
        self._tables: list[torch.Tensor] = []  # the scorer calls' page tables, beside _scored

    def attach(self, backend_class: type) -> None:
        """Wrap ``backend_class.mla_attend`` (our DSA subclass) and SGLang's decode scorer."""
        checker, attend = self, backend_class.mla_attend

        def mla_attend(backend, query, kv_cache, slots, layer):
            out = attend(backend, query, kv_cache, slots, layer)
            if checker.corrupt is not None:
                out = out * checker.corrupt
            try:
                checker.record_call(query, kv_cache, slots, layer.scaling, out)
            except Exception as err:  # a checker problem is reported, never hidden
                checker.problems.add(repr(err)[:300])
            checker.write()
            return out

        backend_class.mla_attend = mla_attend
        self.wrap_scorer()

    def wrap_scorer(self) -> None:
        import importlib

        from mla_backend import indexer

        module = importlib.import_module(INDEXER_MODULE)
        resolver = getattr(module, RESOLVER, None)
        holder = getattr(module, "deep_gemm", None)
        paged = resolver() if resolver is not None else getattr(holder, "fp8_paged_mqa_logits", None)
        if paged is None:
            self.problems.add(f"SGLang's decode scorer is not reachable (deep_gemm is {holder!r})")
            return
        self.scorer = "mla_backend" if paged is indexer.fp8_paged_mqa_logits else getattr(paged, "__module__", "?")
        paged_logits = self.scoring_through(paged)
        if resolver is not None:
            setattr(module, RESOLVER, lambda: paged_logits)
        else:
            holder.fp8_paged_mqa_logits = paged_logits

    def score(self, q, kv_cache, weights, context_lens, block_table) -> None:
        before = len(self._scored)
        super().score(q, kv_cache, weights, context_lens, block_table)
        if len(self._scored) > before:
            self._tables.append(block_table)

    def record_call(self, query, kv_cache, slots, scale: float, out) -> None:
        """One attention call: its rows in float64, and its lists against the scorer call before it."""
        scored, tables, self._scored, self._tables = self._scored, self._tables, [], []
        tokens = query.shape[0]
        self.calls["decode"] += 1
        if len(scored) == 1 and scored[0][0].shape[0] == tokens:
            logits, lengths = scored[0]
            self.check_topk(positions_of_slots(slots[:tokens], tables[0], lengths), logits, lengths)
        if len(self.checks) >= self.max_calls:
            return
        rows = kv_cache.view(torch.uint8) if kv_cache.dtype == torch.float8_e4m3fn else kv_cache
        result = check_sparse_slots(query, slots, rows, scale, out)
        self.checks.append({"kind": "decode", "tokens": tokens, **result.__dict__})

    def write(self) -> None:
        if self.sink is not None:
            self.sink.write_text(json.dumps(self.summary()))


KV_DTYPES = {"auto": torch.bfloat16, "bfloat16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def install() -> None:
    """Entry point: where ENV is set, our DSA subclass is wrapped as mla_backend's plugin builds it."""
    settings = os.environ.get(ENV)
    if not settings:
        return
    import sys

    from mla_backend.sglang import dsa

    settings = json.loads(settings)
    sink = process_summary(Path(settings["summary"]), os.getpid())
    corrupt = None if settings["corruption"] == 1.0 else settings["corruption"]
    checker = SGLangSparseChecker(KV_DTYPES[settings["kv"]], sink, corrupt)
    make_subclass = dsa.make_subclass

    def make_checked_subclass(base, module):
        subclass = make_subclass(base, module)
        checker.attach(subclass)
        return subclass

    dsa.make_subclass = make_checked_subclass
    built = getattr(sys.modules.get(dsa.DSA_MODULE), dsa.CLASS_NAME, None)
    if getattr(built, "mla_backend_subclass", False):  # built before this plugin loaded
        checker.attach(built)


__all__ = ["SGLangSparseChecker", "install", "plugin_env", "positions_of_slots", "read_summary"]
