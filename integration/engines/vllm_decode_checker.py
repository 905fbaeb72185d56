"""Checks an in-process vLLM engine's MLA decode (``forward_mqa``) on the real paged cache against the
float64 reference (integration/judges/decode_check.py), in eager and in CUDA-graph mode.

Graph mode is where a wrapper around ``forward_mqa`` runs only while the graph is captured, never
on the replays that serve decode. So, during capture, the wrapper also records copies of the call's
inputs and outputs into buffers it keeps (probes) and bumps a counter: every replay refills them.
After each model step the checker reads the probes of the graphs that replayed (their counters
moved) and recomputes those calls in float64 while the cache still holds that step's state, except the
rows of each call's own new tokens, which a drafter's later draft steps rewrite within the step: those
are copied with the call (judges/decode_check.py's own_keys). Eager calls are copied the same way as
they happen. Only calls made after the engine finished starting
(``arm()``) count: warm-up, profiling and capture runs carry dummy data. Rows that see fewer than
MIN_VISIBLE_KEYS keys are not counted as checked (judges/decode_check.py says why).
"""

from __future__ import annotations

from collections import Counter

import torch

from integration.judges.decode_check import DecodeCall, check_call, own_keys
from mla_backend.reference import ROW_ERROR_TOLERANCE

MAX_PROBES = 4096  # graph-captured calls the counters cover (layers x captured batch sizes)


class DecodeChecker:
    """Wraps an MLA impl class's forward_mqa for one engine run (see the module docstring).

    ``corrupt``: multiply every output by this factor and add 0.5 to every LSE (a test of the check
    itself: it must fail).
    ``force_lse``: ask the impl for its LSE (as decode context parallelism does) so it is checked too.
    """

    def __init__(
        self,
        impl_cls,
        kv_dtype: torch.dtype,
        max_calls: int = 48,
        force_lse: bool = False,
        corrupt: float | None = None,
    ):
        self.impl_cls = impl_cls
        self.kv_dtype = kv_dtype
        self.max_calls = max_calls
        self.force_lse = force_lse
        self.corrupt = corrupt
        self.armed = False
        self.q_lens: Counter = Counter()  # real calls (after arm) by query tokens per request
        self.calls_by_layer: Counter = Counter()  # real calls by layer (a drafter's layers come after the target's)
        self.graph_calls = 0  # of those, served by graph replays
        self.checks: list[dict] = []
        self.problems: set[str] = set()
        self.routes: set[str] = set()  # the kernels our backend's routes ran (route.py), as its calls were handed them
        self._pending: list[DecodeCall] = []
        self._probes: list[tuple[DecodeCall, int]] = []
        self._counters = torch.zeros(MAX_PROBES, dtype=torch.int64, device="cuda")
        self._seen = torch.zeros_like(self._counters)
        self._original = None

    # --- wrapping ---------------------------------------------------------------------------

    def __enter__(self):
        self._original = original = self.impl_cls.forward_mqa
        checker = self

        def forward_mqa(impl, q, kv_cache, metadata, layer):
            if checker.force_lse:
                impl.need_to_return_lse_for_decode = True
            out, lse = original(impl, q, kv_cache, metadata, layer)
            if checker.corrupt is not None:
                out.mul_(checker.corrupt)
                if lse is not None:
                    lse.add_(0.5)
            try:
                checker.record(impl, q, kv_cache, metadata, layer, out, lse)
            except Exception as err:  # a checker problem is reported, never hidden
                checker.problems.add(repr(err)[:200])
            return out, lse

        self.impl_cls.forward_mqa = forward_mqa
        return self

    def __exit__(self, *exc):
        self.impl_cls.forward_mqa = self._original

    def arm(self) -> None:
        """The engine has started: from now on calls are real. Replays so far are not counted."""
        torch.cuda.synchronize()
        self._seen.copy_(self._counters)
        self._pending.clear()
        self.armed = True

    def record(self, impl, q, kv_cache, metadata, layer, out, lse) -> None:
        if hasattr(impl, "route"):  # our backend: the route this step's decode ran
            from mla_backend.vllm.backend import step_route

            self.routes.add(step_route(impl, metadata).kernel)
        tokens = (q[0] if isinstance(q, tuple) else q).shape[0]
        requests = metadata.num_decodes
        if not requests or tokens % requests:  # a varlen batch (FLASH_ATTN_MLA decodes short prefills)
            return
        capturing = torch.cuda.is_current_stream_capturing()
        if not capturing and not self.armed:
            return
        if not capturing and len(self._pending) + len(self.checks) >= self.max_calls:
            self.q_lens[tokens // requests] += 1
            self.calls_by_layer[getattr(layer, "layer_name", "?")] += 1
            return
        query = torch.cat(q, dim=-1) if isinstance(q, tuple) else q.clone()  # a copy either way
        decode = metadata.decode
        fp8_kv = impl.kv_cache_dtype.startswith("fp8")
        k_scale = layer._k_scale_float if fp8_kv else 1.0
        q_scale = layer._q_scale_float if query.dtype == torch.float8_e4m3fn else 1.0
        call = DecodeCall(
            layer=getattr(layer, "layer_name", "?"),
            query=query,
            kv_cache=kv_cache,
            block_table=decode.block_table.clone(),
            seq_lens=decode.seq_lens.clone(),
            num_decodes=requests,
            q_len=tokens // requests,
            bmm1=impl.scale * q_scale * k_scale,
            bmm2=k_scale,
            out=out.clone(),
            lse=None if lse is None else lse.clone(),
            own_keys=own_keys(kv_cache, decode.block_table, decode.seq_lens[:requests], tokens // requests),
        )
        if capturing:  # the clones above are part of the graph: each replay refills them
            index = len(self._probes)
            if index >= MAX_PROBES:
                raise RuntimeError(f"more than {MAX_PROBES} graph-captured decode calls")
            self._counters[index : index + 1].add_(1)
            self._probes.append((call, index))
        else:
            self.q_lens[call.q_len] += 1
            self.calls_by_layer[call.layer] += 1
            self._pending.append(call)

    # --- after each model step ------------------------------------------------------------------

    def after_step(self) -> None:
        """Check this step's calls: eager copies, and the probes of the graphs that replayed."""
        if not self.armed:
            return
        torch.cuda.synchronize()
        calls, self._pending = self._pending, []
        moved = set((self._counters != self._seen).nonzero().flatten().tolist())
        self._seen.copy_(self._counters)
        replayed = [call for call, index in self._probes if index in moved]
        for call in replayed:
            self.q_lens[call.q_len] += 1
            self.calls_by_layer[call.layer] += 1
        self.graph_calls += len(replayed)
        for call in calls + replayed:
            if len(self.checks) >= self.max_calls:
                break
            try:
                result = check_call(call)
            except Exception as err:
                self.problems.add(repr(err)[:200])
                continue
            if result.rows:
                self.checks.append(
                    {
                        "layer": call.layer,
                        "q_len": call.q_len,
                        "rows": result.rows,
                        "out_error": result.out_error,
                        "lse_error": result.lse_error,
                        "lse_ok": result.lse_ok,
                        "graph": call in replayed,
                    }
                )

    def summary(self) -> dict:
        from mla_backend.vllm import flashmla

        # Where auto handed decode to vLLM's FlashMLA, its outputs are held to FlashMLA's bar.
        bars = flashmla.ROW_ERROR_TOLERANCE if "flashmla" in self.routes else ROW_ERROR_TOLERANCE
        tolerance = bars[self.kv_dtype]
        worst: dict[int, float] = {}
        for check in self.checks:
            worst[check["q_len"]] = max(worst.get(check["q_len"], 0.0), check["out_error"])
        lse_checked = [c for c in self.checks if c["lse_error"] is not None]
        return {
            "q_lens": dict(self.q_lens),
            "calls_by_layer": dict(sorted(self.calls_by_layer.items())),
            "graph_calls": self.graph_calls,
            "checked_calls": len(self.checks),
            "checked_graph_calls": sum(c["graph"] for c in self.checks),
            "checked_layers": sorted({c["layer"] for c in self.checks}),
            "checked_rows": sum(c["rows"] for c in self.checks),
            "max_rel_error": worst,
            "tolerance": tolerance,
            "lse_checked_calls": len(lse_checked),
            "lse_ok": all(c["lse_ok"] for c in lse_checked),
            "max_lse_error": max((c["lse_error"] for c in lse_checked), default=None),
            "check_problems": sorted(self.problems),
            "routes": sorted(self.routes),
        }
