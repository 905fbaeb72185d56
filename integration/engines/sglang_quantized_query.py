"""SGLang's triton decode with the query rounded to FP8, the reference for our FP8 decode.

With an FP8 cache our kernels take the query in FP8 as well (clamped to e4m3's range, no scale; as
FlashMLA and FlashInfer do), while SGLang's triton decode keeps it in bf16. That difference moves
top-2 logprob gaps by up to a few tenths of a nat, more than the tie rule allows, so an FP8 token
comparison against plain triton judges the quantisation, not the kernel. This reference runs the
same triton decode on the query ours sees: the FP8 results are judged on the dequantised FP8 inputs.

With speculative decoding the drafts are verified by triton's extend path (``forward_extend`` in a
target-verify batch), which reads the verified tokens' own keys from the bf16 inputs rather than the
FP8 cache. There the query and those keys and values are rounded to FP8 as the cache stores them
(divided by the layer's k_scale where it has one), so every key the reference reads is the one ours
reads from the cache.

Installed in SGLang's processes as the decode check is (a test-only entry point, group
``sglang.srt.plugins``, ``plugin_env``); it does nothing unless ENV is set.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from integration.engines.entry_point_dir import entry_point_dir, path_with

ENV = "MLA_E2E_SGLANG_FP8_QUERY"
ENTRY_POINT = "integration.engines.sglang_quantized_query:install"
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def plugin_env(root: Path) -> dict:
    """The environment of a triton engine whose decode query is rounded to FP8."""
    path = entry_point_dir(root, "sglang.srt.plugins", "mla_backend_e2e_fp8_query", ENTRY_POINT)
    return {ENV: "1", "PYTHONPATH": path_with(path)}


def rounded_to_fp8(q: torch.Tensor) -> torch.Tensor:
    """The query as our FP8 kernels read it, back in the caller's dtype."""
    return q.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(q.dtype)


def stored_in_fp8(x: torch.Tensor | None, scale) -> torch.Tensor | None:
    """A new key or value as an FP8 cache holds it (x / scale in e4m3), back in x's dtype and scale."""
    if x is None:
        return None
    if scale is None:
        return x.to(torch.float8_e4m3fn).to(x.dtype)
    return ((x / scale).to(torch.float8_e4m3fn).to(x.dtype)) * scale


def install() -> None:
    """Entry point: where ENV is set, wraps TritonAttnBackend's decode (the query) and its verify of
    drafts (the query and the verified tokens' keys and values) for MLA layers."""
    if not os.environ.get(ENV):
        return
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    decode, extend = TritonAttnBackend.forward_decode, TritonAttnBackend.forward_extend
    if getattr(decode, "_rounds_query_to_fp8", False):  # plugins may load twice in a process
        return

    def forward_decode(self, q, k, v, layer, forward_batch, *args, **kwargs):
        if self.use_mla:
            q = rounded_to_fp8(q)
        return decode(self, q, k, v, layer, forward_batch, *args, **kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, *args, **kwargs):
        if self.use_mla and forward_batch.forward_mode.is_target_verify():
            scale = getattr(layer, "k_scale", None)
            q, k, v = rounded_to_fp8(q), stored_in_fp8(k, scale), stored_in_fp8(v, scale)
        return extend(self, q, k, v, layer, forward_batch, *args, **kwargs)

    forward_decode._rounds_query_to_fp8 = forward_extend._rounds_query_to_fp8 = True
    TritonAttnBackend.forward_decode, TritonAttnBackend.forward_extend = forward_decode, forward_extend
