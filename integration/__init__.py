"""Engine-level checks run on a GPU, in rooms by job:

- ``models/``: what the engines are fed: seeded small checkpoints per family, the real-dimension
  DeepSeek-V3 config, the seeded prompts.
- ``engines/``: the vLLM and SGLang drivers: engine arguments, engines in this process or one of their
  own, the test-only plugins that carry the float64 decode check into the engines' processes.
- ``judges/``: the rules that judge results: the tie rule on greedy tokens, the float64 comparison of
  one decode call (and of one sparse call, with the indexer's top-k), the verdicts on a run (its
  decode check, speculation, the route, parallel and data-parallel runs).
- ``settings.py``: the few settings more than one room reads (a leaf).
- the runnable checks at the top (``run_e2e.py``, ``zoo_e2e.py``, ``serve_check.py``,
  ``fault_check.py``, ``dp_e2e.py``, ``sglang_e2e.py``, ``sglang_fault_check.py``,
  ``real_dims.py``, ``sparse_e2e.py``): each composes models, engines and judges.

Imports go one way: checks -> engines, judges, models, settings; engines -> settings, and
judges.decode_check and judges.sparse_check only (the float64 comparisons run inside the engine's
process, while the cache still holds the step's state); judges -> judges, settings; models ->
models. tests/test_integration_layout.py holds it to that. The checks run as scripts from the
checkout (``python integration/run_e2e.py ...``): each appends the checkout to ``sys.path``, after
the installed packages, so the mla_backend under test is the installed one.
"""
