"""The engine drivers: vLLM (vllm_spec.py, vllm_engine.py, vllm_server.py for ``vllm serve``,
vllm_references.py, glm_dense_only.py) and SGLang (sglang_engine.py; sglang_server.py and
sglang_client.py for ``sglang.launch_server`` and its ``/generate``; prometheus.py reads either
server's ``/metrics``), and the test-only plugins that
carry the float64 decode check into the engines' own processes (vllm_decode_checker.py,
vllm_worker_check.py, sglang_decode_check.py, entry_point_dir.py) or round SGLang's reference query to
FP8 (sglang_quantized_query.py). They pass no verdict: integration/judges/ does, on what they return."""
