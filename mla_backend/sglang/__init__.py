"""SGLang plugin: registers mla_backend's decode kernels as the attention backend ``mla_backend``.

SGLang (0.5.12 and newer) runs the entry points of the group ``sglang.srt.plugins`` in every process
(CLI, engine, schedulers, workers); ``register`` then makes the name known where SGLang looks it up:

- the backend registry (``attention_registry.ATTENTION_BACKENDS``), through its decorator;
- the drafter's backends, stamped with their own name (draft_backends.py), so the drafter's
  layers do not take our backend's forward path;
- the CLI's choices (``server_args.ATTENTION_BACKEND_CHOICES``);
- DeepSeek's routing: the per-backend forward-method handler (decode runs absorbed MLA) and the list
  of backends that take the absorbed query as its two parts (q_nope [T, H, 512], q_pe [T, H, 64]),
  which the kernels read in place.

Start SGLang with ``--decode-attention-backend mla_backend`` (prefill on any backend SGLang has, e.g.
``--prefill-attention-backend triton``) or ``--attention-backend mla_backend`` alone (prefill and extend
then run SGLang's triton backend, prefill.py). Any page size that is a power of two from 1 (SGLang's
default) to 1024 is served. Settings come from the ``MLA_BACKEND_*`` environment variables (SGLang has
no per-backend configuration).
"""

from __future__ import annotations

NAME = "mla_backend"
WORKSPACE_BYTES = 64 << 20  # a backend's split-KV partials (dense and DSA); the split plan fits what it gets


def register() -> None:
    """Entry point (``sglang.srt.plugins``); idempotent."""
    from sglang.srt import server_args
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS, register_attention_backend
    from sglang.srt.models.deepseek_common import attention_backend_handler, utils

    from . import dsa
    from .backend import create_backend
    from .draft_backends import stamp_draft_backends

    if NAME not in ATTENTION_BACKENDS:
        register_attention_backend(NAME)(create_backend)
    if NAME not in server_args.ATTENTION_BACKEND_CHOICES:
        server_args.ATTENTION_BACKEND_CHOICES.append(NAME)
    # Decode and speculative verification run absorbed MLA, as with SGLang's triton backend.
    attention_backend_handler.AttentionBackendRegistry.register(NAME, attention_backend_handler.handle_attention_triton)
    if NAME not in utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS:
        utils.FORWARD_ABSORB_CORE_ATTENTION_BACKENDS.append(NAME)
    stamp_draft_backends()
    # DeepSeek Sparse Attention: our kernels as the dsa backend's decode (--dsa-decode-backend mla_backend).
    dsa.add_decode_choice()
    dsa.install()
    dsa.indexer_without_deep_gemm()
