"""Checks the SGLang plugin's decode calls on the real paged cache against the float64 reference, in
eager mode: each call is recomputed as it happens, while the layer's cache still holds that step's
state. The comparison is the vLLM check's (integration/judges/decode_check.py's check_call): rows that
see at least MIN_VISIBLE_KEYS keys, worst relative L2 error of a row; the summary is judged by
integration/judges/decode_verdict.py's judge_sglang_check.

SGLang serves from a scheduler process of its own, so the check is installed there the way SGLang
installs plugins: ``plugin_dir`` writes a test-only entry point (group ``sglang.srt.plugins``) that
runs ``install`` in every SGLang process (``plugin_env``: the environment that puts it on the path);
the settings travel in an environment variable and each scheduler process (one per data-parallel
attention rank) writes its summary to a file of its own after every call; ``read_summary`` adds them up.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from integration.engines.entry_point_dir import entry_point_dir, path_with

ENV = "MLA_E2E_DECODE_CHECK"  # {"corruption": float, "summary": path}
ENTRY_POINT = "integration.engines.sglang_decode_check:install"


def plugin_dir(root: Path) -> Path:
    """A directory to put on PYTHONPATH: it holds the test-only entry point."""
    return entry_point_dir(root, "sglang.srt.plugins", "mla_backend_e2e_check", ENTRY_POINT)


def plugin_env(root: Path, corruption: float, summary: Path) -> dict:
    """The environment of an engine whose decode calls are checked: the settings, and a PYTHONPATH
    that starts with the entry point's directory (plugin_dir)."""
    settings = json.dumps({"corruption": corruption, "summary": str(summary)})
    return {ENV: settings, "PYTHONPATH": path_with(plugin_dir(root))}


def process_summary(summary: Path, pid: int) -> Path:
    """The file one scheduler process writes: ``summary``'s name with the process id in it."""
    return summary.with_name(f"{summary.stem}.{pid}{summary.suffix}")


def written_summaries(summary: Path) -> list[Path]:
    """The files the scheduler processes wrote for ``summary`` (process_summary's names)."""
    return sorted(summary.parent.glob(f"{summary.stem}.*{summary.suffix}"))


def clear_summary(summary: Path) -> None:
    """Removes what an earlier run of the same settings wrote."""
    for written in written_summaries(summary):
        written.unlink()


def read_summary(summary: Path) -> dict | None:
    """The summaries every scheduler process wrote, added up (None where none was written): calls and
    rows summed, the worst error over all, the calls per query length, and how many processes checked
    calls."""
    parts = [json.loads(p.read_text()) for p in written_summaries(summary)]
    if not parts:
        return None
    q_lens: dict[str, int] = {}
    for part in parts:
        for q_len, calls in part.get("q_lens", {}).items():
            q_lens[q_len] = q_lens.get(q_len, 0) + calls
    return {
        "calls": sum(p["calls"] for p in parts),
        "rows": sum(p["rows"] for p in parts),
        "max_rel_err": max(p["max_rel_err"] for p in parts),
        "q_lens": q_lens,
        "processes": len(parts),
    }


def install() -> None:
    """Entry point: wraps MLADecodeBackend._attend where ENV is set (the checked engine only)."""
    settings = os.environ.get(ENV)
    if not settings:
        return
    from integration.judges.decode_check import DecodeCall, check_call
    from mla_backend.sglang.backend import MLADecodeBackend

    settings = json.loads(settings)
    corruption, sink = settings["corruption"], process_summary(Path(settings["summary"]), os.getpid())
    summary = {"calls": 0, "rows": 0, "max_rel_err": 0.0, "q_lens": {}}
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
        summary["q_lens"][str(meta.q_len)] = summary["q_lens"].get(str(meta.q_len), 0) + 1  # drafts: 1 + k
        summary["rows"] += result.rows
        summary["max_rel_err"] = max(summary["max_rel_err"], result.out_error)
        sink.write_text(json.dumps(summary))
        return out

    MLADecodeBackend._attend = attend
