"""The drafter's per-step attention backends beside ours (SGLang EAGLE/NEXTN with several draft steps).

DeepSeek's attention picks its forward path from the backend name stamped on the attention backend it
runs under, and takes the server's decode backend (ours) where none is stamped. SGLang 0.5.17 leaves
the per-step backends of a multi-step drafter (``--speculative-draft-attention-backend triton``)
unstamped, so the drafter's layers took our path, the query in two parts, and called triton with a
``q_rope`` keyword it does not take. Later SGLang stamps them itself; this stamps only what is unset.
"""

from __future__ import annotations

import functools

STAMPED = ("prefill_attention_backend_str", "decode_attention_backend_str")


def stamp_draft_step_backends() -> None:
    """Wrap SGLang's draft backend factory so each per-step backend carries the drafter's backend name;
    idempotent."""
    from sglang.srt.speculative.draft_utils import DraftBackendFactory

    create = DraftBackendFactory.create_decode_backend
    if getattr(create, "stamps_draft_steps", False):
        return

    @functools.wraps(create)
    def create_decode_backend(self):
        steps = create(self)
        name = getattr(self, "draft_attn_backend", None)
        if steps is not None and name:
            for backend in getattr(steps, "attn_backends", ()):
                for attribute in STAMPED:
                    if getattr(backend, attribute, None) is None:
                        setattr(backend, attribute, name)
        return steps

    create_decode_backend.stamps_draft_steps = True  # type: ignore[attr-defined]
    DraftBackendFactory.create_decode_backend = create_decode_backend
