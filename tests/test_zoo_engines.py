"""Where the model zoo's engines run (integration/zoo_e2e.py): each in a process of its own by default,
as vLLM 0.26's Model Runner V2 needs (a second engine in one process trips the CUDA caching
allocator), from dev/gpu_session.sh's default command as from the script's; ``--in-process``
(``IN_PROCESS=1``) runs them in this one, except a multimodal wrapper's."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from integration import zoo_e2e  # noqa: E402
from integration.models.families import FAMILIES  # noqa: E402

GLM = next(f for f in FAMILIES if f.name.startswith("GLM-4.7-Flash"))
FALLBACK = next(f for f in FAMILIES if f.expect == "fallback")


def session_zoo_argv(env: dict[str, str]) -> list[str]:
    """The zoo's command line as dev/gpu_session.sh's zoo part builds it under ``env``, run with its
    ``run`` printing the arguments instead of running them."""
    text = (ROOT / "dev" / "gpu_session.sh").read_text()
    start = text.index("    zoo) ") + len("    zoo) ")
    command = text[start : text.index(" ;;", start)]
    script = f'run() {{ printf "%s\\n" "$@"; }}\nOUT=/out\n{command}\n'
    env = {"PATH": "/usr/bin:/bin", **env}
    result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()
    assert argv[:2] == ["python3", "integration/zoo_e2e.py"], argv
    return argv[2:]


def test_the_session_s_default_zoo_command_isolates_every_engine():
    argv = session_zoo_argv({})
    assert "--in-process" not in argv
    assert zoo_e2e.parse_args(argv).isolated
    assert zoo_e2e.parse_args([]).isolated  # the script's own default


def test_in_process_is_asked_for_by_name():
    argv = session_zoo_argv({"IN_PROCESS": "1", "FAMILIES": "DeepSeek-V2-Lite", "SELFTEST": "1"})
    args = zoo_e2e.parse_args(argv)
    assert not args.isolated and args.selftest and args.families == "DeepSeek-V2-Lite"


def fake_engines(monkeypatch, vision_tower=False):
    """Engines that record where they would run: ("isolated" | "here", backend)."""
    runs: list[tuple[str, str]] = []

    def engine(where):
        def run(spec, model, prompts, corrupt=None, **kwargs):
            runs.append((where, spec.backend))
            return {"spec": {}, "name": spec.name, "tokens": [], "decode_check": {}, "routes": []}

        return run

    def reference_runs(model, prompts, rows, kvs, isolated=False):
        runs.append(("isolated" if isolated else "here", "references"))
        return {}

    monkeypatch.setattr(zoo_e2e, "family_checkpoint", lambda family, layout, model_dir: "model")
    monkeypatch.setattr(zoo_e2e, "has_vision_tower", lambda model: vision_tower)
    monkeypatch.setattr(zoo_e2e, "run_engine", engine("here"))
    monkeypatch.setattr(zoo_e2e, "run_engine_isolated", engine("isolated"))
    monkeypatch.setattr(zoo_e2e, "reference_runs", reference_runs)
    monkeypatch.setattr(zoo_e2e, "reference_row", lambda ref: (ref["name"], "reference", ""))
    monkeypatch.setattr(zoo_e2e, "judge", lambda result, refs, route: (True, []))
    monkeypatch.setattr(zoo_e2e, "judge_selftest", lambda check, spec: (True, "caught"))
    monkeypatch.setattr(zoo_e2e, "start_up_stops", lambda *args: True)
    monkeypatch.setattr(zoo_e2e, "TOKENS", {})
    return runs


@pytest.mark.parametrize("argv", [[], ["--in-process"]])
def test_a_family_s_engines_run_where_the_command_line_says(monkeypatch, tmp_path, argv):
    runs = fake_engines(monkeypatch)
    args = zoo_e2e.parse_args(argv)
    assert zoo_e2e.run_family(GLM, "TP1", {"fp8", "auto"}, tmp_path, True, args.isolated, [])
    where = "isolated" if args.isolated else "here"
    assert where == ("here" if argv else "isolated")
    # The references, ours per KV dtype, the selftest.
    assert runs == [(where, "references"), (where, "CUSTOM"), (where, "CUSTOM"), (where, "CUSTOM")]


def test_a_multimodal_wrapper_s_engines_are_isolated_even_in_process(monkeypatch, tmp_path):
    runs = fake_engines(monkeypatch, vision_tower=True)
    assert zoo_e2e.run_family(GLM, "TP1", {"fp8"}, tmp_path, False, False, [])
    assert {where for where, _ in runs} == {"isolated"}


@pytest.mark.parametrize("isolated", [True, False])
def test_the_fallback_family_s_engines_follow_the_same_choice(monkeypatch, tmp_path, isolated):
    runs = fake_engines(monkeypatch)
    layout = next(iter(FALLBACK.heads))
    assert zoo_e2e.run_fallback(FALLBACK, layout, {"fp8"}, tmp_path, isolated, [])
    assert runs == [("isolated" if isolated else "here", backend) for backend in ("TRITON_MLA", "CUSTOM")]
