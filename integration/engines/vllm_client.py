"""The ``openai`` client as the vLLM checks drive ``vllm serve``: greedy completions, token ids in and
out (``return_token_ids``), with the top-2 logprob gap of every generated token for the tie rule, whole
or streamed (and left mid-stream, as a user closing the page does). No verdicts.
"""

from __future__ import annotations

import asyncio
import time

REQUEST_TIMEOUT_S = 300
EXTRA_BODY = {"return_token_ids": True, "ignore_eos": True, "return_tokens_as_token_ids": True}


def client_for(port: int):
    from openai import AsyncOpenAI

    # No retries: a request sent twice would hide a failed one and double the load.
    return AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0
    )


def gaps_of(top_logprobs) -> list[float]:
    """Top-2 logprob gap per step from the completions API's ``top_logprobs`` (one dict per token)."""
    gaps = []
    for step in top_logprobs or []:
        values = sorted((step or {}).values(), reverse=True)
        gaps.append(values[0] - values[1] if len(values) > 1 else float("inf"))
    return gaps


async def complete(client, model: str, prompt: list[int], max_tokens: int, delay_s: float = 0.0) -> dict:
    """One greedy completion, sent after ``delay_s``: its tokens, top-2 gaps and finish reason."""
    await asyncio.sleep(delay_s)
    response = await client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0, logprobs=2, extra_body=EXTRA_BODY
    )
    choice = response.choices[0]
    tokens = list(choice.model_extra.get("token_ids") or [])
    return {
        "tokens": tokens,
        "gaps": gaps_of(choice.logprobs and choice.logprobs.top_logprobs),
        "finish": choice.finish_reason,
    }


async def stream(client, model: str, prompt: list[int], max_tokens: int, leave_after: int | None = None) -> dict:
    """One greedy streamed completion: tokens, gaps, (arrival time, tokens) per chunk. With
    ``leave_after`` the client disconnects after that many chunks (0: as soon as the server
    answers), as a user closing the page does."""
    begun = time.monotonic()
    response = await client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body=EXTRA_BODY,
    )
    tokens, gaps, chunks, finish, left = [], [], [], None, False
    try:
        if leave_after == 0:
            left = True
        else:
            async for chunk in response:
                if not chunk.choices:
                    continue  # the usage chunk
                choice = chunk.choices[0]
                ids = list((choice.model_extra or {}).get("token_ids") or [])
                tokens += ids
                gaps += gaps_of(choice.logprobs and choice.logprobs.top_logprobs)
                chunks.append((time.monotonic(), len(ids)))
                finish = choice.finish_reason or finish
                if leave_after is not None and len(chunks) >= leave_after and finish is None:
                    left = True
                    break
    finally:
        await response.close()
    return {"tokens": tokens, "gaps": gaps, "chunks": chunks, "finish": finish, "left": left, "begun": begun}
