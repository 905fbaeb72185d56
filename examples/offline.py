"""Offline generation through vLLM with mla_backend serving MLA decode.

python examples/offline.py deepseek-ai/DeepSeek-V2-Lite-Chat
"""

import sys

from vllm import LLM, SamplingParams

model = sys.argv[1] if len(sys.argv) > 1 else "deepseek-ai/DeepSeek-V2-Lite-Chat"
llm = LLM(
    model=model,
    attention_backend="CUSTOM",  # registered by mla_backend's vLLM plugin
    kv_cache_dtype="fp8",
    additional_config={"mla_backend": {"backend": "auto"}},  # validated by mla_backend's config model
    trust_remote_code=True,
)
outputs = llm.generate(["The capital of France is", "def fibonacci(n):"], SamplingParams(max_tokens=64))
for output in outputs:
    print(repr(output.outputs[0].text))
