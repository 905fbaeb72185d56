"""integration/serve_check.py's client side against a stand-in server that answers in vLLM's
completion format (token ids out with ``return_token_ids``, usage in the last streamed chunk): the
requests carry what the check relies on and the answers are read back as vLLM sends them."""

import asyncio
import json
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the integration package, from the checkout
from http_stand_in import QuietHandler  # noqa: E402

from integration import serve_check  # noqa: E402


def next_tokens(prompt, n):
    return [(t + 1) % 2048 for t in (prompt * n)[:n]]


class VllmLikeHandler(QuietHandler):
    requests: list = []

    def do_GET(self):
        self.send(b"vllm:num_requests_running 0\n" if self.path == "/metrics" else b"", "text/plain")

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append(request)
        n, head = request["max_tokens"], {"id": "c", "object": "text_completion", "created": 0, "model": "m"}
        choice = {"index": 0, "text": "", "finish_reason": "length"}
        if not request.get("stream"):
            ids = next_tokens(request["prompt"], n) if request.get("return_token_ids") else None
            usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
            self.send(
                json.dumps({**head, "choices": [{**choice, "token_ids": ids}], "usage": usage}).encode(),
                "application/json",
            )
            return
        chunks = [{**head, "choices": [choice]} for _ in range(n)]
        if request.get("stream_options", {}).get("include_usage"):
            chunks.append(
                {**head, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}}
            )
        body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        self.send(body.encode(), "text/event-stream")


@pytest.fixture
def server():
    VllmLikeHandler.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), VllmLikeHandler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()


def test_the_check_reads_token_ids_and_streamed_token_counts_as_vllm_sends_them(server):
    prompts, load = [[1, 2, 3], [7, 8]], [[4, 5]] * 5
    tokens, counts, seconds = asyncio.run(serve_check.drive(server, "m", prompts, load))
    assert tokens == [next_tokens(p, serve_check.GREEDY_TOKENS) for p in prompts]
    assert counts == [serve_check.LOAD_TOKENS] * len(load) and seconds > 0
    assert serve_check.metrics_answer(server)
    greedy = [r for r in VllmLikeHandler.requests if not r.get("stream")]
    assert all(r["temperature"] == 0.0 and r["return_token_ids"] and r["ignore_eos"] for r in greedy)
    assert sorted(r["prompt"] for r in greedy) == sorted(prompts)  # token ids in, not text


def test_a_stream_without_its_usage_counts_zero_tokens(server, monkeypatch):
    """A stream that ends without the usage chunk must not count as finished."""
    original = serve_check.streamed_token_counts

    async def without_usage(client, model, prompts):
        real = client.completions.create

        async def create(**kwargs):
            kwargs.pop("stream_options")
            return await real(**kwargs)

        monkeypatch.setattr(client.completions, "create", create)
        return await original(client, model, prompts)

    monkeypatch.setattr(serve_check, "streamed_token_counts", without_usage)
    _, counts, _ = asyncio.run(serve_check.drive(server, "m", [[1]], [[2]]))
    assert counts == [0]


@pytest.mark.slow  # writes seeded checkpoints with transformers
def test_a_sparse_family_is_served_with_prompts_past_its_top_k(tmp_path):
    """--family DeepSeek-V3.2: its seeded checkpoint (the indexer's fields in its config), two prompts
    longer than the top-k beside short ones, and room for them; a dense family is refused."""
    model, name, prompts, max_model_len = serve_check.served_model("DeepSeek-V3.2", 16, tmp_path)
    config = json.loads((Path(model) / "config.json").read_text())
    assert name == "DeepSeek-V3.2" and config["index_topk"] == 2048
    assert len(prompts) == serve_check.GREEDY_PROMPTS
    assert sum(len(p) > config["index_topk"] for p in prompts) == 2
    assert max(map(len, prompts)) + serve_check.GREEDY_TOKENS <= max_model_len
    assert all(0 <= t < config["vocab_size"] for p in prompts for t in p)
    with pytest.raises(SystemExit, match="sparse family"):
        serve_check.served_model("DeepSeek-V3", 16, tmp_path)


def test_served_tokens_may_part_from_the_offline_ones_only_where_the_offline_engine_is_undecided():
    """Before the offline run's first tie (a gap below 0.1 nats) or the step where its batch run and
    its one-at-a-time run part, served tokens must match it."""
    offline = {"tokens": [[1, 2, 3, 4], [5, 6, 7, 8]], "gaps": [[1.0] * 4, [1.0, 1.0, 0.05, 1.0]]}
    offline["alone_tokens"] = [[1, 2, 3, 4], [5, 6, 7, 8]]
    name, ok, note = serve_check.greedy_row([[1, 2, 3, 4], [5, 6, 7, 9]], offline)
    assert name == "greedy vs offline" and ok and "1/2 identical" in note  # prompt 1 parts after its tie
    assert not serve_check.greedy_row([[1, 9, 3, 4], [5, 6, 7, 8]], offline)[1]  # parts before any tie
    offline["alone_tokens"][0] = [1, 7, 7, 7]  # alone, the offline engine itself chooses otherwise at step 1
    assert serve_check.greedy_row([[1, 9, 3, 4], [5, 6, 7, 8]], offline)[1]
