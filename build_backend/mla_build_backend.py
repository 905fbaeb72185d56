"""In-tree PEP 517 backend: setuptools, plus torch (for its stable-ABI headers) when a wheel is built
with kernels. Editable installs and kernel-less wheels (MLA_BACKEND_ARCHS=none) need no torch to build."""

import os

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - the standard hooks

TORCH_FOR_HEADERS = "torch>=2.11,<2.12"  # the oldest supported torch: the ABI the libraries target


def get_requires_for_build_wheel(config_settings=None):
    requires = _setuptools.get_requires_for_build_wheel(config_settings)
    if os.environ.get("MLA_BACKEND_ARCHS", "all").strip().lower() != "none":
        requires.append(TORCH_FOR_HEADERS)
    return requires
