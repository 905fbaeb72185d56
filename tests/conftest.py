"""Collection rules shared by the test files."""

import importlib.util

import pytest

# The SGLang adapter's tests need SGLang, which cannot share an environment with vLLM 0.26: CI runs
# them in a stage of their own (-m sglang), where a missing SGLang leaves nothing to collect and fails.
collect_ignore = [] if importlib.util.find_spec("sglang") else ["test_sglang_plugin.py"]

# The test modules that import vLLM as they load (each marked vllm throughout). Where vLLM is not
# installed (CI's torch-newest stage: no vLLM release takes that torch) each stands as one test marked
# vllm that fails saying why: -m "not vllm" deselects it with vLLM's other tests, and a run that does
# not deselect them fails rather than passing without them.
VLLM_MODULES = {"test_vllm_plugin.py", "test_engine_best.py", "test_model_zoo_cpu.py"}


class NeedsVllm(pytest.Item):
    def runtest(self):
        pytest.fail(f"{self.path.name} needs vLLM, which is not installed: deselect vLLM's tests with -m 'not vllm'")

    def reportinfo(self):
        return self.path, None, f"{self.path.name}: needs vLLM"


class VllmModuleWithoutVllm(pytest.File):
    def collect(self):
        item = NeedsVllm.from_parent(self, name="needs_vllm")
        item.add_marker(pytest.mark.vllm)
        return [item]


def pytest_pycollect_makemodule(module_path, parent):
    if module_path.name in VLLM_MODULES and importlib.util.find_spec("vllm") is None:
        return VllmModuleWithoutVllm.from_parent(parent, path=module_path)
    return None
