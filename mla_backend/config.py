"""Settings of mla_backend (route.py decides, from them and the GPU, which kernel serves decode).

Sources, later ones win: defaults < environment (``MLA_BACKEND``, ``MLA_BACKEND_<FIELD>``)
< explicit values (Python kwargs or vLLM's ``--additional-config '{"mla_backend": {...}}'``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .kernel_build import KernelVariant
from .kernel_constants import MAX_KV_SPLITS

BackendName = Literal["auto", "xqa", "trtllm-gen"]
Fp8QkName = Literal["auto", "f16", "e4m3"]
Fp8PvName = Literal["auto", "f32", "f16"]

ENV_PREFIX = "MLA_BACKEND"
# Environment variable -> field. MLA_BACKEND alone names the backend, as users expect.
ENV_FIELDS = {
    "MLA_BACKEND": "backend",
    "MLA_BACKEND_NUM_KV_SPLITS": "num_kv_splits",
    "MLA_BACKEND_ENABLE_PDL": "enable_pdl",
    "MLA_BACKEND_VALIDATE_PAGE_IDS": "validate_page_ids",
    "MLA_BACKEND_CACHE_DIR": "cache_dir",
    "MLA_BACKEND_DEVICE_CAPABILITY": "device_capability",
    "MLA_BACKEND_FP8_QK": "fp8_qk",
    "MLA_BACKEND_FP8_PV": "fp8_pv",
}
# Read by the wheel build (setup.py), not a run-time setting: known, so not rejected as a typo.
BUILD_ENV = {"MLA_BACKEND_ARCHS"}


class MLABackendConfig(BaseModel):
    """Validated settings. Unknown keys and bad values raise ``pydantic.ValidationError``.

    Values from Python and from JSON must already have the field's type (strict: ``"4"``, ``4.0``
    or ``"yes"`` are errors, not guesses); environment variables are strings, parsed by
    :func:`_parse_env`'s documented spellings before validation."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    backend: BackendName = Field(
        "auto", description="Kernel family: auto (pick by GPU), xqa (bundled), trtllm-gen (FlashInfer, SM100)."
    )
    num_kv_splits: int | None = Field(
        None,
        ge=1,
        le=MAX_KV_SPLITS,
        description="Split each request's KV over this many CTAs; None picks from SM count, batch and length.",
    )
    enable_pdl: bool | None = Field(
        None, description="Programmatic dependent launch; None enables it where the GPU supports it (SM90+)."
    )
    validate_page_ids: bool = Field(
        False,
        description="On GPU tensors, check seq_lens and page ids on the host before each launch "
        "(a device sync: for debugging). CPU tensors are always checked.",
    )
    cache_dir: str | None = Field(
        None, description="Where the JIT build keeps compiled kernels; None means ~/.cache/mla_backend."
    )
    device_capability: str | None = Field(
        None,
        pattern=r"^\d+\.\d+$",
        description="Choose the kernel as if the GPU had this compute capability, e.g. '8.0' to exercise "
        "the portable fallback on a GPU the bundled kernels serve. None uses the real one.",
    )

    fp8_qk: Fp8QkName = Field(
        "auto",
        description="How the FP8 kernels multiply Q by K: e4m3 mma.sync (native QMMA on SM 8.9/12.x, "
        "emulated on SM90), or f16 (Q widened once; sm_90a only). auto: f16 on sm_90a, e4m3 elsewhere. "
        "e4m3 on an H100/H200 runs the SM120 code path there, for testing.",
    )
    fp8_pv: Fp8PvName = Field(
        "auto",
        description="How the FP8 kernels sum P.V: f32 (f16 x f16 + f32 MMA), or f16 within each 16-token "
        "step and f32 across them (f16-accumulate MMA: twice the f32 rate on GeForce Blackwell; built "
        "for sm_90a, sm_120a, sm_121a). auto: f16 on sm_120a and sm_121a, where P.V bounds the tensor "
        "pipe at 128 heads and the error over the FP8 sweep matched f32's; f32 elsewhere (docs/performance.md).",
    )

    @property
    def kernel_variant(self) -> KernelVariant:
        return KernelVariant(self.fp8_qk, self.fp8_pv)

    def capability(self, detected: tuple[int, int]) -> tuple[int, int]:
        """The compute capability kernel choice uses: the override, else the detected one."""
        if self.device_capability is None:
            return (int(detected[0]), int(detected[1]))
        major, minor = self.device_capability.split(".")
        return (int(major), int(minor))

    @classmethod
    def from_sources(
        cls,
        overrides: Mapping[str, Any] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> MLABackendConfig:
        """Merge environment variables and explicit overrides, then validate."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var, field in ENV_FIELDS.items():
            raw = environ.get(var)
            if raw is not None and raw.strip() != "":
                values[field] = _parse_env(var, raw)
        unknown = sorted(
            k for k in environ if k.startswith(ENV_PREFIX + "_") and k not in ENV_FIELDS and k not in BUILD_ENV
        )
        if unknown:
            raise ValueError(f"unknown environment variable(s) {unknown}; mla_backend reads {sorted(ENV_FIELDS)}")
        values.update(dict(overrides or {}))
        return cls.model_validate(values)

    @classmethod
    def from_additional_config(
        cls, additional_config: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
    ) -> MLABackendConfig:
        """Read the ``mla_backend`` section of vLLM's ``--additional-config``."""
        section = (additional_config or {}).get("mla_backend", {})
        if not isinstance(section, Mapping):
            raise ValueError(f'additional_config["mla_backend"] must be a JSON object, got {type(section).__name__}')
        return cls.from_sources(section, environ)


@functools.lru_cache(maxsize=1)
def default_config() -> MLABackendConfig:
    """The process-wide settings, read once from the environment."""
    return MLABackendConfig.from_sources()


def _parse_env(var: str, raw: str) -> Any:
    raw = raw.strip()
    if var in ("MLA_BACKEND_ENABLE_PDL", "MLA_BACKEND_VALIDATE_PAGE_IDS"):
        lowered = raw.lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        if lowered == "auto" and var == "MLA_BACKEND_ENABLE_PDL":
            return None
        raise ValueError(
            f"{var}={raw!r}: expected one of 1/0/true/false" + ("/auto" if var == "MLA_BACKEND_ENABLE_PDL" else "")
        )
    if var == "MLA_BACKEND_NUM_KV_SPLITS":
        if raw.lower() == "auto":
            return None
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{var}={raw!r}: expected a whole number or 'auto'") from None
    return raw


class BackendUnavailableError(ValueError):
    """An explicitly requested backend cannot run on this device."""


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, naming the setting: for logs and CLI output."""
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "config"
        lines.append(f"mla_backend.{where}: {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)
