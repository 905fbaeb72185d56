"""The drafter's attention backends beside ours (SGLang EAGLE/NEXTN, drafter on SGLang's own backend).

DeepSeek's attention picks its forward path from the backend name stamped on the attention backend it
runs under, and takes the server's decode backend (ours) where none is stamped. SGLang 0.5.17 leaves
the drafter's backends unstamped: the per-step backends of a multi-step drafter and, with
``--speculative-attention-mode decode``, its draft-extend backend. The drafter's layers then took our
path, the query in two parts, and called triton with a ``q_rope`` keyword it does not take. Later
SGLang stamps them itself; this stamps only what is unset, with the drafter's backend name.
"""

from __future__ import annotations

import functools

STAMPED = ("prefill_attention_backend_str", "decode_attention_backend_str")


def stamp(backend, name: str) -> None:
    for attribute in STAMPED:
        if getattr(backend, attribute, None) is None:
            setattr(backend, attribute, name)


def stamp_draft_backends() -> None:
    """Wrap SGLang's draft backend factory (0.5.12 to 0.5.23 have it) so the backends it builds carry the
    drafter's backend name; idempotent. An SGLang without that factory is left as it is."""
    try:
        from sglang.srt.speculative.draft_utils import DraftBackendFactory
    except ImportError:
        return

    def stamping(create, backends_of):
        if getattr(create, "stamps_draft_backends", False):
            return create

        @functools.wraps(create)
        def create_and_stamp(self):
            built = create(self)
            name = getattr(self, "draft_attn_backend", None)
            if built is not None and name:
                for backend in backends_of(built):
                    stamp(backend, name)
            return built

        create_and_stamp.stamps_draft_backends = True  # type: ignore[attr-defined]
        return create_and_stamp

    # One backend per draft step, in a container; the draft extend's is one backend.
    built_by = {
        "create_decode_backend": lambda s: getattr(s, "attn_backends", ()),
        "create_draft_extend_backend": lambda b: (b,),
    }
    for method, backends_of in built_by.items():
        if hasattr(DraftBackendFactory, method):
            setattr(DraftBackendFactory, method, stamping(getattr(DraftBackendFactory, method), backends_of))
