"""The speculation judge: a speculative run's real decode calls carried 1 + k query tokens per
request, vLLM proposed drafts, and a drafter with MLA layers decoded its draft steps on ours."""

from __future__ import annotations

import re

from integration.settings import drafter_has_mla_layers

LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


def drafter_calls(result: dict) -> int:
    """Real calls of ours from the drafter's layers, which vLLM numbers after the target's."""
    target = result.get("target_layers")
    if target is None:
        return 0
    by_layer = result["decode_check"].get("calls_by_layer", {})
    return sum(n for name, n in by_layer.items() if (m := LAYER_INDEX.search(name)) and int(m[1]) >= target)


def judge_speculation(result: dict) -> tuple[bool, str]:
    """Real decode calls (not warm-up or capture runs) carried 1 + k query tokens per request, vLLM
    proposed drafts, and, with k >= 2, a drafter with MLA layers made calls of its own (its draft
    steps after the first are decodes of one token)."""
    q_lens = {int(k): v for k, v in result["decode_check"]["q_lens"].items()}
    counts = result.get("spec_decode", {})
    spec = result["spec"]
    ok = q_lens.get(1 + spec["spec_tokens"], 0) > 0 and counts.get("num_drafts", 0) > 0
    note = f"real decode calls by q_len {dict(sorted(q_lens.items()))}, drafts {counts.get('num_drafts', 0)}"
    if drafter_has_mla_layers(spec["spec_method"]):
        drafted = drafter_calls(result)
        ok = ok and (drafted > 0 or spec["spec_tokens"] < 2)
        note += f", the drafter's own calls {drafted}"
    rate = counts.get("acceptance_rate")
    return ok, note + (f", acceptance {rate:.0%}" if rate is not None else "")
