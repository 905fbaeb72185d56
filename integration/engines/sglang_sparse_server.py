"""A DSA model (DeepSeek-V3.2, GLM-5) under ``python -m sglang.launch_server`` for the serve part of
integration/sglang_sparse_e2e.py: SGLang's dsa backend with the decode sub-backend under test, page 64,
SGLang's radix cache and scheduler as a user gets them, the process started and stopped as
sglang_server.py does it. Traffic through the native ``/generate`` (sglang_client.py; greedy, token ids
in): the check's prompts in one batch, then the same prompts streamed ``copies`` times each, all at
once (the copies read their prompts from the radix cache the batch filled); ``/metrics`` before and
after. It passes no verdict.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from integration.engines import sglang_client as client
from integration.engines.sglang_engine import NEW_TOKENS, SPARSE_STAND_IN_PACKAGES
from integration.engines.sglang_server import launch_command, server_env, settled, start, stop
from integration.engines.vllm_server import free_port, running

START_TIMEOUT_S = 300
SETTLE_TIMEOUT_S = 15.0


async def traffic(port: int, prompts: list[list[int]], copies: int) -> dict:
    before = await asyncio.to_thread(settled, port, SETTLE_TIMEOUT_S)
    batch = await client.together(port, prompts, NEW_TOKENS)
    streamed = await client.streams(port, prompts * copies, NEW_TOKENS) if copies else []
    after = await asyncio.to_thread(settled, port, SETTLE_TIMEOUT_S)
    return {"batch": batch, "streams": streamed, "metrics": [before, after]}


def serve(
    model: str,
    prompts: list[list[int]],
    decode: str,
    kv: str,
    log: Path,
    *,
    graphs: bool,
    copies: int,
    env: dict[str, str] | None = None,
) -> dict:
    """A server of ``decode`` on ``model`` for the time of its traffic: ``{"batch", "streams",
    "metrics": [before, after], "log", "server": {"command", "start_s", "stopped", "exit"}}`` (the log
    as it stood before the SIGINT, which makes uvicorn's exit noisy), or ``{"error", "server"}`` where
    it did not start or a request failed. ``env``: a test-only plugin's settings and SGLang settings."""
    port = free_port()
    command = launch_command(model, port, decode, kv, graphs=graphs, sparse=True)
    record: dict = {"command": command[3:]}
    result: dict = {}

    def read_log() -> None:
        result["log"] = log.read_text(errors="replace")

    environment = server_env(env, SPARSE_STAND_IN_PACKAGES)
    try:
        with running(
            command, log, port, record, START_TIMEOUT_S, environment, start=start, stop=stop, before_stop=read_log
        ):
            result.update(asyncio.run(traffic(port, prompts, copies)))
    except Exception as error:  # noqa: BLE001 - a server that fails is a row of the table, not the run's end
        return {"error": f"{type(error).__name__}: {error}"[:600], "log": result.get("log", ""), "server": record}
    return {**result, "server": record}
