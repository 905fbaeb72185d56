"""What the engines are fed: seeded small checkpoints per MLA family (families.py, checkpoints.py; as
SGLang reads them: sglang_checkpoint.py), DeepSeek-V3's real attention dimensions as a config-only
checkpoint (real_dims.py), and the seeded prompts (prompts.py)."""
