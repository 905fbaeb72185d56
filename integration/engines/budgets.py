"""New tokens per request, as the checks' clients take them: one number for all, or one each."""

from __future__ import annotations


def budgets(prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[int]:
    """New tokens per prompt: one number for all, or one each (as many as prompts)."""
    wanted = [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(wanted) != len(prompts):
        raise ValueError(f"{len(wanted)} token budgets for {len(prompts)} prompts")
    return wanted
