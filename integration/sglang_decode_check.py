"""Checks the SGLang plugin's decode calls on the real paged cache against the float64 reference, in
eager mode: each call is recomputed as it happens, while the layer's cache still holds that step's
state. The comparison is the vLLM check's (decode_check.check_call): rows that see at least
MIN_VISIBLE_KEYS keys, worst relative L2 error of a row against ROW_ERROR_TOLERANCE.

SGLang serves from a scheduler process of its own, so the check is installed there the way SGLang
installs plugins: ``plugin_dir`` writes a test-only entry point (group ``sglang.srt.plugins``) that
runs ``install`` in every SGLang process; the settings travel in an environment variable and the
scheduler writes its summary to a file after every call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from entry_point_dir import entry_point_dir

ENV = "MLA_E2E_DECODE_CHECK"  # {"corruption": float, "summary": path}


def plugin_dir(root: Path) -> Path:
    """A directory to put on PYTHONPATH: it holds the test-only entry point."""
    return entry_point_dir(root, "sglang.srt.plugins", "mla_backend_e2e_check", "sglang_decode_check:install")


def install() -> None:
    """Entry point: wraps MLADecodeBackend._attend where ENV is set (the checked engine only)."""
    settings = os.environ.get(ENV)
    if not settings:
        return
    from decode_check import DecodeCall, check_call

    from mla_backend.sglang.backend import MLADecodeBackend

    settings = json.loads(settings)
    corruption, sink = settings["corruption"], Path(settings["summary"])
    summary = {"calls": 0, "rows": 0, "max_rel_err": 0.0}
    original = MLADecodeBackend._attend

    def attend(self, q, q_rope, layer, forward_batch):
        out = original(self, q, q_rope, layer, forward_batch) * corruption
        meta = self.forward_metadata
        query = torch.cat([part.float() for part in self._query_parts(q, q_rope, layer, meta)], dim=-1)
        bmm1, bmm2 = self._scales(layer)
        cache = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        requests = query.shape[0]
        result = check_call(
            DecodeCall(
                layer=str(layer.layer_id),
                query=query.flatten(0, 1),
                kv_cache=cache.view(-1, self.page_size, cache.shape[-1]),
                block_table=meta.block_tables,
                seq_lens=meta.seq_lens,
                num_decodes=requests,
                q_len=meta.q_len,
                bmm1=float(bmm1),
                bmm2=float(bmm2),
                out=out.view(requests * meta.q_len, layer.tp_q_head_num, -1),
                lse=None,
            )
        )
        summary["calls"] += 1
        summary["rows"] += result.rows
        summary["max_rel_err"] = max(summary["max_rel_err"], result.out_error)
        sink.write_text(json.dumps(summary))
        return out

    MLADecodeBackend._attend = attend


def judge(summary: dict, fp8: bool) -> tuple[bool, str]:
    from decode_check import MIN_VISIBLE_KEYS

    from mla_backend.reference import ROW_ERROR_TOLERANCE

    tolerance = ROW_ERROR_TOLERANCE[torch.float8_e4m3fn if fp8 else torch.bfloat16]
    ok = summary["rows"] > 0 and summary["max_rel_err"] <= tolerance
    note = (
        f"max rel err {summary['max_rel_err']:.1e} (tol {tolerance:.0e}; {summary['calls']} calls, "
        f"{summary['rows']} rows of >= {MIN_VISIBLE_KEYS} keys)"
    )
    return ok, note
