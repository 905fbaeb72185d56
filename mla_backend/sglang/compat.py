"""The one place that knows how the SGLang releases CI tests (0.5.17 and 0.5.23) differ for the adapter.

Feature detection, not version numbers, so a release in between gets whatever its API offers:
- server arguments: 0.5.17's ``ServerArgs`` is a dataclass that resolves itself in place (``__post_init__``
  writes page size, speculative defaults and the like onto its fields) and answers
  ``get_attention_backends()``. 0.5.23's is a msgspec record of the operator's raw input, without that
  method: resolution keeps its decisions beside the fields (``_resolved_overrides``), read through
  ``sglang.srt.arg_groups.overrides.resolved_view``, and ``attention_backends_of`` gives the
  (prefill, decode) pair, as SGLang's own factories read them (attention_registry.py,
  ``create_trtllm_mla_backend``). An unset ``--page-size`` or ``--speculative-num-steps`` reads
  None on 0.5.23's record and 1 or 3 (DeepSeek's NEXTN) once resolved.
- the drafter's attention backends: 0.5.17 leaves those of its draft backend factory unstamped,
  0.5.23 stamps them itself (``DraftBackendFactory._create_backend``); draft_backends.py stamps only
  what is unset, so one code path serves both.
"""

from __future__ import annotations

from typing import Any


def _resolves_in_place(server_args: Any) -> bool:
    return callable(getattr(server_args, "get_attention_backends", None))


def resolved(server_args: Any) -> Any:
    """The server arguments as SGLang runs with them: the record itself where it resolved in place
    (0.5.17), else the view of resolution's decisions over the raw input (0.5.23)."""
    if _resolves_in_place(server_args):
        return server_args
    from sglang.srt.arg_groups.overrides import resolved_view

    return resolved_view(server_args)


def attention_backends(settings: Any) -> tuple[str | None, str | None]:
    """(prefill, decode) attention backends of ``resolved(server_args)``, the split flags falling back
    to ``--attention-backend`` as SGLang reads them."""
    if _resolves_in_place(settings):
        return settings.get_attention_backends()
    from sglang.srt.arg_groups.overrides import attention_backends_of

    return attention_backends_of(settings)


__all__ = ["attention_backends", "resolved"]
