"""The rules that judge results, as functions of what the engines returned: the tie rule on greedy
tokens (tokens.py), the float64 comparison of one decode call (decode_check.py), the verdicts on a
run's decode check (decode_verdict.py), its speculation (speculation.py), a run against vLLM's
references with its route (vllm_run.py), runs split over GPUs (parallel.py), a server under faults
(faults.py; SGLang's metrics and log in sglang_faults.py), a fault check's parts as rows and its
table (report.py), and an SGLang engine our backend must stop at start-up (sglang_refusal.py).
They import nothing from integration but each other and settings.py."""
