"""The model zoo's split part (integration/zoo_e2e.py --parts split): ours with a family's heads split
by tensor parallelism, and its KV by decode context parallelism on top, judged against ours on one GPU
with vLLM's FLASHMLA at the same layouts beside it, as run_e2e.py's parallel runs are."""

import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integration import zoo_e2e  # noqa: E402
from integration.judges.parallel import PARALLEL_PEER  # noqa: E402
from integration.models.families import FAMILIES  # noqa: E402

KIMI = next(f for f in FAMILIES if f.name.startswith("Kimi-K2"))


def fake_engines(monkeypatch, tmp_path, routes=("bundled",), single_ok=True):
    """Engines that record their specs; returns the list of specs started and of judge_parallel calls."""
    started, judged = [], []

    def run_engine_isolated(spec, model, prompts):
        started.append(spec)
        return {"spec": asdict(spec), "name": spec.name, "decode_check": {"ok": single_ok}, "routes": list(routes)}

    def judge_parallel(result, single, peer, peer_single):
        judged.append((result["name"], single["name"], peer["name"], peer_single["name"]))
        return True, ["judged"]

    monkeypatch.setattr(zoo_e2e, "save_checkpoint", lambda family, path, layout: path)
    monkeypatch.setattr(zoo_e2e, "run_engine_isolated", run_engine_isolated)
    monkeypatch.setattr(zoo_e2e, "run_isolated_or_error", run_engine_isolated)
    monkeypatch.setattr(zoo_e2e, "judge_decode_check", lambda check, spec: (check["ok"], "checked"))
    monkeypatch.setattr(zoo_e2e, "judge_parallel", judge_parallel)
    return started, judged


def test_each_split_is_judged_against_ours_on_one_gpu_with_the_peer_at_the_same_layouts(monkeypatch, tmp_path):
    started, judged = fake_engines(monkeypatch, tmp_path)
    rows: list = []
    assert zoo_e2e.run_split(KIMI, "TP1", {"fp8"}, tmp_path, 2, [1, 2], rows)

    layouts = [(s.backend, s.tp, s.dcp, s.mla_backend) for s in started]
    assert layouts == [
        ("CUSTOM", 1, 1, zoo_e2e.OURS),
        (PARALLEL_PEER, 1, 1, {}),  # the peer runs its own kernels, not ours forced
        ("CUSTOM", 2, 1, zoo_e2e.OURS),
        (PARALLEL_PEER, 2, 1, {}),
        ("CUSTOM", 2, 2, zoo_e2e.OURS),
        (PARALLEL_PEER, 2, 2, {}),
    ]
    names = [s.name for s in started]
    assert judged == [(names[2], names[0], names[3], names[1]), (names[4], names[0], names[5], names[1])]
    assert [status for _, status, _ in rows] == ["PASS"] * 3
    assert all("64 heads over 2 GPUs, 32 a rank" in name for name, _, _ in rows)


def test_a_split_off_our_kernels_fails_and_a_failed_single_gpu_check_skips_the_splits(monkeypatch, tmp_path):
    fake_engines(monkeypatch, tmp_path, routes=("flashmla",))
    rows: list = []
    assert not zoo_e2e.run_split(KIMI, "TP1", {"fp8"}, tmp_path, 2, [1], rows)
    assert rows[-1][1] == "FAIL" and "route ['flashmla'] != bundled" in rows[-1][2]

    started, judged = fake_engines(monkeypatch, tmp_path, single_ok=False)
    rows = []
    assert not zoo_e2e.run_split(KIMI, "TP1", {"fp8", "auto"}, tmp_path, 2, [1, 2], rows)
    assert [s.tp for s in started] == [1, 1] and not judged  # each KV dtype's one-GPU run, nothing split
    assert [status for _, status, _ in rows] == ["FAIL", "FAIL"]
