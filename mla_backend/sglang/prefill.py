"""Prefill beside our decode when one flag names mla_backend for both (``--attention-backend mla_backend``).

SGLang then asks our factory for a single backend and hands it every forward mode. Our kernels decode
only, so the backend we give is SGLang's own composition of two (``HybridAttnBackend``, as it builds for
``--prefill-attention-backend triton --decode-attention-backend mla_backend``): prefill and extend on
SGLang's triton backend, decode (and verification in decode attention mode) on ours. The layers see
our name stamped for both modes, so they take triton's dispatch (handle_attention_triton) and hand
absorbed queries in two parts, which the triton delegate joins (fallback.py).
"""

from __future__ import annotations

from . import fallback


def with_triton_prefill(runner, decode_backend):
    """One backend for every forward mode: SGLang's triton for prefill and extend, ``decode_backend`` for
    decode, verification as SGLang's ``--speculative-attention-mode`` sends it."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend

    return HybridAttnBackend(runner, prefill_backend=fallback.triton_backend(runner), decode_backend=decode_backend)
