"""Build variants of the FP8 QK^T (config fp8_qk): flags, build directories and stamps, no compiler."""

import pytest

from mla_backend.jit import build_dir, fp8_qk_variant, nvcc_flags, source_stamp

WIDEN = "-DMLA_FP8_QK_VIA_F16"


def test_auto_widens_q_only_on_sm90():
    assert fp8_qk_variant("sm_90a") == "f16" and WIDEN in nvcc_flags("sm_90a")
    for arch in ("sm_89", "sm_120a", "sm_100a"):
        assert fp8_qk_variant(arch) == "e4m3" and WIDEN not in nvcc_flags(arch)


def test_the_sm120_layout_builds_for_sm90_apart_from_the_default(tmp_path):
    assert WIDEN not in nvcc_flags("sm_90a", fp8_qk="e4m3")
    default, e4m3 = build_dir("sm_90a", str(tmp_path)), build_dir("sm_90a", str(tmp_path), "e4m3")
    assert default.name == "sm_90a" and e4m3.name == "sm_90a-fp8qk-e4m3"
    assert build_dir("sm_90a", str(tmp_path), "f16") == default  # the default spelled out
    assert source_stamp("sm_90a", "e4m3") != source_stamp("sm_90a")


def test_f16_q_is_refused_where_shared_memory_is_99_kb():
    with pytest.raises(ValueError, match="sm_90a only"):
        nvcc_flags("sm_120a", fp8_qk="f16")


def test_one_process_loads_one_variant(monkeypatch):
    import mla_backend.jit as jit

    builds = []
    monkeypatch.setattr(jit.torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    monkeypatch.setattr(jit, "build_and_load", lambda arch, cache_dir=None, fp8_qk="auto": builds.append(fp8_qk))
    monkeypatch.setattr(jit, "_loaded", [])
    jit.ensure_loaded.cache_clear()
    try:
        jit.ensure_loaded(0, None, "auto")
        jit.ensure_loaded(0, None, "f16")  # the same library, spelled out: nothing to load
        with pytest.raises(RuntimeError, match="use another process"):
            jit.ensure_loaded(0, None, "e4m3")
        assert builds == ["auto"]
    finally:
        jit.ensure_loaded.cache_clear()
