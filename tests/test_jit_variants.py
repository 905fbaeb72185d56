"""Build variants of the FP8 QK^T (config fp8_qk): flags, build directories and stamps, no compiler."""

from typing import get_args

import pytest

from mla_backend.config import Fp8QkName
from mla_backend.jit import build_dir, csrc_dir
from mla_backend.kernel_build import FP8_QK_CHOICES, fp8_qk_variant, library_filename, nvcc_flags, source_stamp

WIDEN = "-DMLA_FP8_QK_VIA_F16"


def test_build_module_knows_the_configs_choices():
    assert FP8_QK_CHOICES == get_args(Fp8QkName)


def test_auto_widens_q_only_on_sm90():
    assert fp8_qk_variant("sm_90a") == "f16" and WIDEN in nvcc_flags("sm_90a")
    for arch in ("sm_89", "sm_120a", "sm_100a"):
        assert fp8_qk_variant(arch) == "e4m3" and WIDEN not in nvcc_flags(arch)


def test_the_sm120_layout_builds_for_sm90_apart_from_the_default(tmp_path):
    assert WIDEN not in nvcc_flags("sm_90a", fp8_qk="e4m3")
    default, e4m3 = build_dir("sm_90a", str(tmp_path)), build_dir("sm_90a", str(tmp_path), "e4m3")
    assert default.name == "sm_90a" and e4m3.name == "sm_90a-fp8qk-e4m3"
    assert build_dir("sm_90a", str(tmp_path), "f16") == default  # the default spelled out
    assert library_filename("sm_90a", "e4m3") != library_filename("sm_90a") == library_filename("sm_90a", "f16")
    assert source_stamp(csrc_dir(), "sm_90a", "e4m3") != source_stamp(csrc_dir(), "sm_90a")


def test_flags_target_the_oldest_supported_torch_abi():
    assert "-DTORCH_TARGET_VERSION=0x020b000000000000" in nvcc_flags("sm_120a")


def test_f16_q_is_refused_where_shared_memory_is_99_kb():
    with pytest.raises(ValueError, match="sm_90a only"):
        nvcc_flags("sm_120a", fp8_qk="f16")
    with pytest.raises(ValueError, match="fp8_qk must be one of"):
        fp8_qk_variant("sm_90a", "e5m2")
