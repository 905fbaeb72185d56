"""Config model: parsing from Python, environment and additional_config."""

import pytest
from pydantic import ValidationError

from mla_backend.config import MLABackendConfig


def test_defaults():
    config = MLABackendConfig()
    assert (config.backend, config.num_kv_splits, config.enable_pdl, config.validate_page_ids) == (
        "auto",
        None,
        None,
        False,
    )


def test_settings_cannot_be_changed_after_validation():
    """A config is validated once and shared (the resolved route depends on it): assigning a field,
    even a valid value, is an error rather than an unvalidated change."""
    config = MLABackendConfig()
    for field, value in (("backend", "flashmla"), ("num_kv_splits", 0), ("backend", "xqa")):
        with pytest.raises(ValidationError):
            setattr(config, field, value)
    assert config.backend == "auto" and config.num_kv_splits is None


@pytest.mark.parametrize(
    "bad",
    [
        {"backend": "flashmla"},
        {"num_kv_splits": 0},
        {"num_kv_splits": 1000},
        {"enable_pdl": "maybe"},
        {"backnd": "xqa"},
    ],
)
def test_bad_values_and_unknown_keys_are_rejected(bad):
    with pytest.raises(ValidationError) as info:
        MLABackendConfig(**bad)
    assert list(bad)[0] in str(info.value)


def test_environment_and_overrides():
    env = {"MLA_BACKEND": "xqa", "MLA_BACKEND_NUM_KV_SPLITS": "8", "MLA_BACKEND_ENABLE_PDL": "0"}
    config = MLABackendConfig.from_sources(environ=env)
    assert (config.backend, config.num_kv_splits, config.enable_pdl) == ("xqa", 8, False)
    config = MLABackendConfig.from_sources({"backend": "auto", "num_kv_splits": None}, environ=env)
    assert (config.backend, config.num_kv_splits, config.enable_pdl) == ("auto", None, False)


def test_the_wheel_builds_variable_is_not_a_typo():
    """MLA_BACKEND_ARCHS is read by setup.py; left set in a shell it must not stop the engine."""
    assert MLABackendConfig.from_sources(environ={"MLA_BACKEND_ARCHS": "sm_90a"}) == MLABackendConfig()


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"MLA_BACKEND": "cutlass"}, "backend"),
        ({"MLA_BACKEND_NUM_KV_SPLITS": "many"}, "MLA_BACKEND_NUM_KV_SPLITS"),
        ({"MLA_BACKEND_ENABLE_PDL": "perhaps"}, "MLA_BACKEND_ENABLE_PDL"),
        ({"MLA_BACKEND_SPLITS": "4"}, "MLA_BACKEND_SPLITS"),
    ],
)
def test_bad_environment_is_rejected_with_its_name(env, fragment):
    with pytest.raises(ValueError) as info:
        MLABackendConfig.from_sources(environ=env)
    assert fragment in str(info.value)


def test_additional_config_section():
    config = MLABackendConfig.from_additional_config(
        {"mla_backend": {"backend": "xqa", "num_kv_splits": 4}, "other": 1}, environ={}
    )
    assert (config.backend, config.num_kv_splits) == ("xqa", 4)
    assert MLABackendConfig.from_additional_config(None, environ={}) == MLABackendConfig()
    with pytest.raises(ValidationError):
        MLABackendConfig.from_additional_config({"mla_backend": {"splits": 4}}, environ={})
    with pytest.raises(ValueError, match="JSON object"):
        MLABackendConfig.from_additional_config({"mla_backend": "xqa"}, environ={})


def test_fp8_qk_variant_from_environment_and_its_values():
    assert MLABackendConfig.from_sources(environ={}).fp8_qk == "auto"
    assert MLABackendConfig.from_sources(environ={"MLA_BACKEND_FP8_QK": "e4m3"}).fp8_qk == "e4m3"
    with pytest.raises(ValidationError, match="fp8_qk"):
        MLABackendConfig.from_sources(environ={"MLA_BACKEND_FP8_QK": "fp16"})


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_kv_splits", "4"),
        ("num_kv_splits", 4.0),
        ("num_kv_splits", True),
        ("enable_pdl", "yes"),
        ("enable_pdl", 1),
        ("validate_page_ids", "true"),
        ("device_capability", 8.0),
        ("backend", b"xqa"),
    ],
)
def test_python_and_json_values_are_not_coerced(field, value):
    """Policy: values from Python or JSON must have the field's type; no guessing."""
    with pytest.raises(ValidationError, match=field):
        MLABackendConfig(**{field: value})
    with pytest.raises(ValidationError, match=field):
        MLABackendConfig.from_additional_config({"mla_backend": {field: value}}, environ={})


@pytest.mark.parametrize(
    "var, raw, field, value",
    [
        ("MLA_BACKEND_NUM_KV_SPLITS", " 4 ", "num_kv_splits", 4),
        ("MLA_BACKEND_NUM_KV_SPLITS", "auto", "num_kv_splits", None),
        ("MLA_BACKEND_ENABLE_PDL", "yes", "enable_pdl", True),
        ("MLA_BACKEND_ENABLE_PDL", "OFF", "enable_pdl", False),
        ("MLA_BACKEND_ENABLE_PDL", "auto", "enable_pdl", None),
        ("MLA_BACKEND_VALIDATE_PAGE_IDS", "1", "validate_page_ids", True),
        ("MLA_BACKEND_DEVICE_CAPABILITY", "8.0", "device_capability", "8.0"),
        ("MLA_BACKEND_CACHE_DIR", "/tmp/k", "cache_dir", "/tmp/k"),
        ("MLA_BACKEND_FP8_QK", "f16", "fp8_qk", "f16"),
    ],
)
def test_environment_strings_are_parsed_by_their_documented_spellings(var, raw, field, value):
    assert getattr(MLABackendConfig.from_sources(environ={var: raw}), field) == value


@pytest.mark.parametrize(
    "env",
    [
        {"MLA_BACKEND_NUM_KV_SPLITS": "4.0"},
        {"MLA_BACKEND_VALIDATE_PAGE_IDS": "auto"},
        {"MLA_BACKEND_DEVICE_CAPABILITY": "9"},
        {"MLA_BACKEND_NUM_KV_SPLITS": "0"},
    ],
)
def test_environment_strings_outside_the_spellings_are_rejected(env):
    with pytest.raises(ValueError, match=next(iter(env)).removeprefix("MLA_BACKEND_").lower() + "|" + next(iter(env))):
        MLABackendConfig.from_sources(environ=env)


def test_an_empty_environment_variable_means_unset():
    assert (
        MLABackendConfig.from_sources(environ={"MLA_BACKEND": " ", "MLA_BACKEND_NUM_KV_SPLITS": ""})
        == MLABackendConfig()
    )


def test_capability_override_is_used_and_the_detected_one_otherwise():
    assert MLABackendConfig().capability((9, 0)) == (9, 0)
    assert MLABackendConfig(device_capability="12.0").capability((9, 0)) == (12, 0)
