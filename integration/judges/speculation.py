"""The speculation judge: a speculative run's real decode calls carried 1 + k query tokens per
request, and vLLM proposed drafts."""

from __future__ import annotations


def judge_speculation(result: dict) -> tuple[bool, str]:
    """Real decode calls (not warm-up or capture runs) carried 1 + k query tokens per request, and
    vLLM proposed drafts."""
    q_lens = {int(k): v for k, v in result["decode_check"]["q_lens"].items()}
    counts = result.get("spec_decode", {})
    ok = q_lens.get(1 + result["spec"]["spec_tokens"], 0) > 0 and counts.get("num_drafts", 0) > 0
    rate = counts.get("acceptance_rate")
    return ok, (
        f"real decode calls by q_len {dict(sorted(q_lens.items()))}, drafts {counts.get('num_drafts', 0)}"
        + (f", acceptance {rate:.0%}" if rate is not None else "")
    )
