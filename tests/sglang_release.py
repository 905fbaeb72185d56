"""The installed SGLang as the -m sglang tests meet it (CI: 0.5.17 and 0.5.23, each in a venv of its own):
its release, the fields of its ServerArgs, stand-in server arguments of its shape, and how a process of
one rank publishes its server arguments. SGLang is imported only when asked, so the plain tests of the
files that use this run without it."""

from __future__ import annotations

from types import SimpleNamespace


def release() -> tuple[int, ...]:
    import sglang
    from packaging.version import Version

    return Version(sglang.__version__).release


def server_args_fields() -> set[str]:
    """The settings ServerArgs takes: a dataclass's fields on 0.5.17, a msgspec record's on 0.5.23."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    if dataclasses.is_dataclass(ServerArgs):
        return {f.name for f in dataclasses.fields(ServerArgs)}
    import msgspec

    return {f.name for f in msgspec.structs.fields(ServerArgs)}


def server_args_like(**values) -> SimpleNamespace:
    """Server arguments holding ``values``, shaped as this release's ServerArgs: with the
    ``get_attention_backends()`` of 0.5.17's record where the release has it."""
    from sglang.srt.server_args import ServerArgs

    args = SimpleNamespace(**values)
    if hasattr(ServerArgs, "get_attention_backends"):
        args.get_attention_backends = lambda: (
            args.prefill_attention_backend or args.attention_backend,
            args.decode_attention_backend or args.attention_backend,
        )
    return args


def resolved_server_args(**values):
    """A real ServerArgs of ``values``, resolved as SGLang's launcher leaves it: 0.5.17's resolves as it is
    built; 0.5.23's keeps the raw input and resolves once asked (``resolve_once``)."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(**values)
    if hasattr(args, "resolve_once"):
        args.resolve_once()
    return args


# For the scripts the tests run in a process of their own: ``publish_as_scheduler(args)`` makes ``args``
# the process's server arguments as a scheduler of one rank has them. 0.5.23 reads its resolved settings,
# model-parallel widths and this process's ranks from what was published (runtime_context.publish with
# SpawnRanks, as scheduler.py's run_scheduler_process does); 0.5.17 sets them with
# set_global_server_args_for_scheduler.
PUBLISH_AS_SCHEDULER = """
def publish_as_scheduler(args):
    from sglang.srt import runtime_context
    if hasattr(runtime_context, "SpawnRanks"):
        runtime_context.publish(args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=0))
    else:
        from sglang.srt.server_args import set_global_server_args_for_scheduler
        set_global_server_args_for_scheduler(args)
"""

# The start of a script that renders SGLang's metrics collectors as /metrics serves them: prometheus_client in
# SGLang's multiprocess mode, server arguments published as a scheduler's (0.5.23's collectors read them from
# there) for a model SGLang resolves them against (the zoo's DeepSeek-V3 config), and the collectors' labels.
METRICS_PROBE_START = (
    PUBLISH_AS_SCHEDULER
    + """
import argparse, os, sys, tempfile
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()  # SGLang's mode: before prometheus_client loads
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
from sglang.srt.server_args import ServerArgs
from integration.models.families import FAMILIES
from integration.models.sglang_checkpoint import save_sglang_config
model = str(save_sglang_config(FAMILIES[0], tempfile.mkdtemp()))
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = ServerArgs.from_cli_args(parser.parse_args(["--model-path", model, "--enable-metrics", "--device", "cpu"]))
publish_as_scheduler(args)
labels = {"model_name": "/m", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
"""
)
