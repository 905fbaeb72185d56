"""SGLang's native ``/generate`` as the fault check's clients use it (SGLang 0.5.17,
sglang/srt/entrypoints/http_server.py and managers/tokenizer_manager.py): token ids in, greedy with
``ignore_eos``, the top-2 logprobs of each new token back; answered whole, or streamed as server-sent
events (``data: {...}`` lines, each holding the output so far, then ``data: [DONE]``), from which a
client may leave early. With aiohttp, which SGLang's own server imports.

Each answer becomes ``{"tokens", "gaps", "finish", "cached", "retractions"}``: the new token ids, the
top-2 logprob gap of each, SGLang's finish reason, the prompt tokens read from the radix cache and how
often SGLang retracted the request; a stream's also holds its chunks' (arrival time, new tokens) and
whether the client left.
"""

from __future__ import annotations

import asyncio
import json
import time

from integration.engines.budgets import budgets

REQUEST_TIMEOUT_S = 300
READ_BUFFER = 1 << 24  # a streamed line holds the output so far with its logprobs: can pass aiohttp's 64 KiB


def request_body(prompt: list[int], max_new_tokens: int, stream: bool = False) -> dict:
    return {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "stream": stream,
    }


def gaps_of(top_logprobs) -> list[float]:
    """Top-2 gap per step from ``meta_info.output_top_logprobs`` (per token, (logprob, token id, text))."""
    gaps = []
    for step in top_logprobs or []:
        values = sorted((entry[0] for entry in step or []), reverse=True)
        gaps.append(values[0] - values[1] if len(values) > 1 else float("inf"))
    return gaps


def result_of(answer: dict) -> dict:
    meta = answer.get("meta_info") or {}
    return {
        "tokens": list(answer.get("output_ids") or []),
        "gaps": gaps_of(meta.get("output_top_logprobs")),
        "finish": meta.get("finish_reason"),
        "cached": meta.get("cached_tokens", 0),
        "retractions": meta.get("num_retractions", 0),
    }


def session():
    import aiohttp

    # No retries and no connection limit: a request sent twice would hide a failed one, and a burst
    # must reach the server together.
    return aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        connector=aiohttp.TCPConnector(limit=0),
        read_bufsize=READ_BUFFER,
    )


async def generate(client, port: int, prompt: list[int], max_new_tokens: int) -> dict:
    """One greedy request, answered whole."""
    url = f"http://127.0.0.1:{port}/generate"
    async with client.post(url, json=request_body(prompt, max_new_tokens)) as response:
        if response.status != 200:
            raise RuntimeError(f"/generate answered {response.status}: {(await response.text())[:300]}")
        return result_of(await response.json(content_type=None))


async def stream(client, port: int, prompt: list[int], max_new_tokens: int, leave_after: int | None = None) -> dict:
    """One greedy streamed request. With ``leave_after`` the client closes the connection after that
    many chunks (0: as soon as the server answers), as a user closing the page does."""
    url = f"http://127.0.0.1:{port}/generate"
    begun = time.monotonic()
    result = {**result_of({}), "chunks": [], "left": False, "begun": begun}
    async with client.post(url, json=request_body(prompt, max_new_tokens, stream=True)) as response:
        if response.status != 200:
            raise RuntimeError(f"/generate answered {response.status}: {(await response.text())[:300]}")
        if leave_after == 0:
            result["left"] = True
        else:
            async for line in response.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[len(b"data:") :].strip()
                if data == b"[DONE]":
                    break
                answer = json.loads(data)
                if "error" in answer:
                    result["finish"] = answer["error"]
                    break
                seen = len(result["tokens"])
                result.update(result_of(answer))  # each chunk holds the output so far
                result["chunks"].append((time.monotonic(), len(result["tokens"]) - seen))
                if leave_after is not None and len(result["chunks"]) >= leave_after and result["finish"] is None:
                    result["left"] = True
                    break
        if result["left"]:
            response.close()  # drops the connection: SGLang aborts the request
    return result


async def together(port: int, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[dict]:
    wanted = budgets(prompts, max_new_tokens)
    async with session() as client:
        return list(await asyncio.gather(*(generate(client, port, p, n) for p, n in zip(prompts, wanted))))


async def one_at_a_time(port: int, prompts: list[list[int]], max_new_tokens: int | list[int]) -> list[dict]:
    wanted = budgets(prompts, max_new_tokens)
    async with session() as client:
        return [await generate(client, port, p, n) for p, n in zip(prompts, wanted)]


async def streams(
    port: int, prompts: list[list[int]], max_new_tokens: int, leave: list[int | None] | None = None
) -> list[dict]:
    leave = leave or [None] * len(prompts)
    async with session() as client:
        return list(await asyncio.gather(*(stream(client, port, p, max_new_tokens, k) for p, k in zip(prompts, leave))))
