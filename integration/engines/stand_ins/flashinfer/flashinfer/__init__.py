"""Stand-in for FlashInfer where it is not installed (the lent GPU's image): SGLang 0.5.17 imports four of
its names without a guard. Each raises if called; with SGLANG_IS_FLASHINFER_AVAILABLE=false, SGLang and
sgl_kernel take their own kernels everywhere, so none is called (integration/engines/sglang_engine.py)."""


def _absent(*args, **kwargs):
    raise RuntimeError("flashinfer is not installed: this is integration/engines/stand_ins' stand-in")


bmm_fp8 = _absent
