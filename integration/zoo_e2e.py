"""The model zoo end to end on vLLM (GPU): each family's seeded small checkpoint (models/) through
``--attention-backend CUSTOM`` against vLLM's own MLA backends, judged as run_e2e.py judges
DeepSeek-V3 (judges/vllm_run.py).

    python integration/zoo_e2e.py --families GLM-4.7-Flash,Kimi-K2 --kv fp8,auto --out results/zoo

Per family and layout (the heads one GPU decodes; ``--layouts all`` for every layout the zoo lists):
- references: FLASHMLA (fp8) and FLASH_ATTN_MLA + TRITON_MLA (bf16), plus TRITON_MLA (fp8) to
  calibrate the tie rule (engines/vllm_references.py);
- ours: page 64, full CUDA graphs, the bundled kernels forced (``backend='xqa'``: at page 64 `auto`
  may hand SM90's decode to FlashMLA), per KV dtype: greedy tokens under the tie rule, every replayed
  decode call recomputed in float64, the route;
- selftest (``--selftest``): ours with outputs x1.05; the float64 check must fail;
- split (``--parts split``, ``--tp N``, ``--dcp 1,2``, N GPUs): ours with the family's heads split by
  tensor parallelism (and its KV by decode context parallelism on top), every rank's decode calls
  recomputed in float64, the tokens against ours on one GPU, judged as run_e2e.py's parallel runs
  are (judges/parallel.py: vLLM's FLASHMLA at the same layouts calibrates the tie rule);
- drafts (``--parts drafts``): the family's drafters at k = ``--draft-tokens``: its own MTP layer
  (GLM-4.7-Flash's ``glm4_moe_lite_mtp``, DeepSeek-V3's ``deepseek_mtp``, LongCat-Flash's
  ``longcat_flash_mtp``; the checkpoint with one MTP layer), Mistral Large 3's Eagle drafter (``eagle``,
  models/mistral_eagle_drafter.py) and, for the families users run with one, an Eagle3 drafter with an
  MLA draft layer (``eagle3``, models/eagle3_drafter.py); ours against
  vLLM's backends run with the same drafter and k, the drafter's MLA layers on the engine's backend,
  judged as the speculative runs of run_e2e.py are (decode calls with 1 + k query tokens, and the
  drafter's own calls, must reach our kernel), and reported against the same target decoded without
  speculation. LongCat's MTP block is standard attention in vLLM: only its verification is ours.
Each engine runs in a process of its own: vLLM 0.26 runs DeepseekV2ForCausalLM and models without
experts on its Model Runner V2, where a second engine in one process trips the CUDA caching allocator
(and a family's engine after another's fails vLLM's memory profiling). ``--in-process`` runs them all
in this process instead, on Model Runner V1 unless VLLM_USE_V2_MODEL_RUNNER says otherwise (quicker
where it works; a multimodal wrapper's engines stay isolated, as vLLM keeps their memory after release).
Families whose MLA shapes only vLLM's Triton MLA takes (``fallback``: Mistral Small 4's 256 + 64 latent)
run under `auto` against TRITON_MLA, judged the same way (the route must be the fallback), and with
``backend='xqa'`` named, where start-up must stop with the zoo's reason. Families whose attention the
zoo expects refused (models/families.py) start an engine with the flag (``--refusals``) and must stop
with the zoo's reason. Exit status 1 if anything fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import torch

# Run as a script: the checkout on the path for the integration package, after the installed packages
# (the mla_backend under test is the installed one).
sys.path.append(str(Path(__file__).resolve().parents[1]))
from integration.engines.glm_dense_only import allow_dense_only_glm  # noqa: E402
from integration.engines.longcat_mtp_weights import skip_longcat_mtp_weights_in_target  # noqa: E402
from integration.engines.text_only import has_vision_tower  # noqa: E402
from integration.engines.vllm_engine import SETUP_ENV, release_engine, run_engine, run_engine_isolated  # noqa: E402
from integration.engines.vllm_references import reference_row, reference_runs, run_isolated_or_error  # noqa: E402
from integration.engines.vllm_spec import EngineSpec, engine_kwargs  # noqa: E402
from integration.judges.decode_verdict import judge_decode_check, judge_selftest  # noqa: E402
from integration.judges.parallel import PARALLEL_PEER, judge_parallel  # noqa: E402
from integration.judges.vllm_run import judge, non_speculative_note  # noqa: E402
from integration.models.checkpoints import save_checkpoint, save_config  # noqa: E402
from integration.models.eagle3_drafter import save_eagle3_drafter  # noqa: E402
from integration.models.families import FAMILIES, Family, pick  # noqa: E402
from integration.models.mistral_eagle_drafter import save_mistral_eagle_drafter  # noqa: E402
from integration.models.prompts import make_prompts  # noqa: E402
from integration.settings import SELFTEST_CORRUPTION  # noqa: E402

OURS = {"backend": "xqa"}
# Drafters that are a layer of the family's checkpoint.
MTP_DRAFTERS = ("deepseek_mtp", "glm4_moe_lite_mtp", "longcat_flash_mtp")


# Each judged engine's greedy tokens with its references' tokens and gaps, by row name: written beside
# zoo.json so a verdict can be recomputed without the GPU (as run_e2e.py's results are).
TOKENS: dict[str, dict] = {}


def keep_tokens(label: str, spec: EngineSpec, result: dict, refs: dict[str, dict]) -> None:
    TOKENS[f"{label}: {spec.name}"] = {
        "ours": result["tokens"],
        "refs": {key: {"tokens": ref["tokens"], "gaps": ref.get("gaps")} for key, ref in refs.items()},
    }


def add_engine_row(rows: list, label: str, spec: EngineSpec, ok: bool, notes: list[str]) -> None:
    """One engine's verdict into the table, printed as it comes."""
    rows.append((f"{label}: {spec.name}", "PASS" if ok else "FAIL", "; ".join(notes)))
    print(f"[zoo] {label} {spec.name}: {'PASS' if ok else 'FAIL'} {'; '.join(notes)}", flush=True)


def checkpoint_path(family: Family, layout: str, model_dir: Path, suffix: str = "") -> Path:
    """Where the family's checkpoint with the layout's heads (and ``suffix``: its drafters) is written."""
    return model_dir / f"{family.published}_h{family.heads[layout]}{suffix}"


def family_checkpoint(family: Family, layout: str, model_dir: Path) -> str:
    """The family's seeded checkpoint with the layout's heads (reused where the same one was written)."""
    return str(save_checkpoint(family, checkpoint_path(family, layout, model_dir), layout))


def run_family(
    family: Family, layout: str, kvs: set[str], model_dir: Path, selftest_too: bool, isolated: bool, rows: list
) -> bool:
    heads = family.heads[layout]
    model = family_checkpoint(family, layout, model_dir)
    runner = {"0": " runner V1", "1": " runner V2"}.get(os.environ.get("VLLM_USE_V2_MODEL_RUNNER", ""), "")
    label = f"{family.name} {layout} ({heads} heads){runner}"
    prompts = make_prompts(0)
    # vLLM 0.26 keeps a multimodal wrapper's engine (its KV cache) alive after release_engine: on the
    # H100, free memory fell by 11.5 GiB with each Kimi-VL engine until the seventh could not start.
    isolated = isolated or has_vision_tower(model)
    run = run_engine_isolated if isolated else run_engine
    try:
        refs = reference_runs(model, prompts, rows, kvs, isolated=isolated)
    except Exception as err:  # a reference that cannot run this family leaves nothing to judge against
        rows.append((f"{label}: references", "FAIL", repr(err)[:300]))
        print(f"[zoo] {label} references: FAIL", flush=True)
        traceback.print_exc()
        return False
    ok_all = True
    for kv in sorted(kvs):
        spec = EngineSpec("CUSTOM", kv, 64, True, mla_backend=OURS)
        try:
            result = run(spec, model, prompts)
            keep_tokens(label, spec, result, refs)
            ok, notes = judge(result, refs, "bundled")
        except Exception as err:  # one family's failure must not hide the others'
            ok, notes = False, [repr(err)[:300]]
        ok_all &= ok
        add_engine_row(rows, label, spec, ok, notes)
    if selftest_too:  # the forward_mqa check on corrupted outputs must fail
        spec = EngineSpec("CUSTOM", sorted(kvs)[-1], 64, True, mla_backend=OURS)
        check = run(spec, model, prompts, corrupt=SELFTEST_CORRUPTION)["decode_check"]
        caught, note = judge_selftest(check, asdict(spec))
        ok_all &= caught
        rows.append((f"{label}: {spec.name} x1.05", "PASS" if caught else "FAIL", note))
    return ok_all


def run_split(
    family: Family, layout: str, kvs: set[str], model_dir: Path, tp: int, dcps: list[int], rows: list
) -> bool:
    """Ours with the layout's heads split over ``tp`` GPUs (and the KV over each of ``dcps``) against
    ours on one GPU; vLLM's PARALLEL_PEER on one GPU and at the same layouts shows how far a split
    moves an engine's tokens by itself. Split engines run in processes of their own."""
    heads = family.heads[layout]
    model = family_checkpoint(family, layout, model_dir)
    label = f"{family.name} ({heads} heads over {tp} GPUs, {heads // tp} a rank)"
    prompts = make_prompts(0)
    ok_all = True
    for kv in sorted(kvs):
        single_spec = EngineSpec("CUSTOM", kv, 64, True, mla_backend=OURS)
        try:
            single = run_engine_isolated(single_spec, model, prompts)
            ok, note = judge_decode_check(single["decode_check"], single["spec"])
        except Exception as err:
            ok, note = False, repr(err)[:300]
        ok_all &= ok
        add_engine_row(rows, label, single_spec, ok, [f"1 GPU: {note}"])
        if not ok:
            continue
        peer_single = run_isolated_or_error(peer_of(single_spec), model, prompts)
        for dcp in dcps:
            spec = replace(single_spec, tp=tp, dcp=dcp)
            try:
                result = run_engine_isolated(spec, model, prompts)
                peer = run_isolated_or_error(peer_of(spec), model, prompts)
                ok, notes = judge_parallel(result, single, peer, peer_single)
                if result["routes"] != ["bundled"]:
                    ok = False
                    notes.append(f"route {result['routes']} != bundled")
            except Exception as err:
                ok, notes = False, [repr(err)[:300]]
            ok_all &= ok
            add_engine_row(rows, label, spec, ok, notes)
    return ok_all


def peer_of(spec: EngineSpec) -> EngineSpec:
    return replace(spec, backend=PARALLEL_PEER, mla_backend={})


def drafters(family: Family, layout: str, model_dir: Path) -> list[tuple[str, str, str | None]]:
    """(speculative method, target checkpoint, drafter checkpoint or None) of each drafter the family
    runs with: its MTP layer (inside a checkpoint that holds one), its Eagle drafter (Mistral Large 3),
    an Eagle3 drafter of its own."""
    runs = []
    if family.drafter in MTP_DRAFTERS:
        path = checkpoint_path(family, layout, model_dir, "_mtp")
        runs.append((family.drafter, str(save_checkpoint(family, path, layout, mtp_layers=1)), None))
    if family.drafter == "eagle":
        target = family_checkpoint(family, layout, model_dir)
        drafter = save_mistral_eagle_drafter(target, checkpoint_path(family, layout, model_dir, "_eagle"))
        runs.append(("eagle", target, str(drafter)))
    if family.eagle3_mla:
        target = family_checkpoint(family, layout, model_dir)
        drafter = save_eagle3_drafter(target, checkpoint_path(family, layout, model_dir, "_eagle3"))
        runs.append(("eagle3", target, str(drafter)))
    return runs


def run_drafts(
    family: Family, layout: str, kvs: set[str], model_dir: Path, draft_tokens: list[int], rows: list
) -> bool:
    """Each of the family's drafters at each k of ``draft_tokens``; every speculative engine runs in a
    process of its own, as run_e2e.py's do."""
    ok_all = True
    for method, model, draft_model in drafters(family, layout, model_dir):
        ok_all &= run_drafter(family, layout, kvs, method, model, draft_model, draft_tokens, rows)
    return ok_all


def run_drafter(
    family: Family,
    layout: str,
    kvs: set[str],
    method: str,
    model: str,
    draft_model: str | None,
    draft_tokens: list[int],
    rows: list,
) -> bool:
    label = f"{family.name} {layout} ({family.heads[layout]} heads)"
    prompts = make_prompts(0)
    try:
        plain = reference_runs(model, prompts, rows, kvs, isolated=True)
    except Exception as err:
        rows.append((f"{label}: references without drafts", "FAIL", repr(err)[:300]))
        return False
    ok_all = True
    for k in draft_tokens:
        drafted = dict(spec_tokens=k, spec_method=method, draft_model=draft_model)
        try:
            refs = reference_runs(model, prompts, rows, kvs, **drafted)
        except Exception as err:
            rows.append((f"{label}: references, {method} k={k}", "FAIL", repr(err)[:300]))
            ok_all = False
            continue
        for kv in sorted(kvs):
            spec = EngineSpec("CUSTOM", kv, 64, True, mla_backend=OURS, **drafted)
            try:
                result = run_engine_isolated(spec, model, prompts)
                keep_tokens(label, spec, result, refs)
                ok, notes = judge(result, refs, "bundled")
                notes.append(non_speculative_note(result, plain, kv))
            except Exception as err:
                ok, notes = False, [repr(err)[:300]]
            ok_all &= ok
            add_engine_row(rows, label, spec, ok, notes)
    return ok_all


def model_import_error(family: Family) -> str | None:
    """Why vLLM cannot import the family's model module (a package the GPU machine lacks), or None:
    said once here, where each engine would otherwise fail on it behind a pickling error."""
    from vllm import ModelRegistry

    # vLLM's entry: lazy ones import their module on load; one registered with its class is imported
    model = ModelRegistry.models[family.architecture]
    try:
        model.load_model_cls()
    except ImportError as err:
        return f"vLLM cannot import its model ({getattr(model, 'module_name', family.architecture)}): {err!r}"
    return None


def refusal(family: Family, model_dir: Path, rows: list) -> bool:
    """An engine of the refused family with the flag (config.json only, dummy weights): start-up must
    stop with the zoo's reason."""
    model = str(save_config(family, model_dir / f"{family.published}_config"))
    return start_up_stops(f"{family.name}: refused", model, EngineSpec("CUSTOM", "auto", 64, False), family, rows)


def start_up_stops(label: str, model: str, spec: EngineSpec, family: Family, rows: list) -> bool:
    """An engine of ``spec`` on ``model`` (dummy weights) must stop at start-up with the family's reason."""
    from vllm import LLM

    kwargs = engine_kwargs(spec, model, 2048, memory_fraction=0.15)
    try:
        LLM(**kwargs, load_format="dummy")
        ok, note = False, "the engine started"
    except Exception as err:
        ok, note = family.refusal in str(err), f"stopped: {str(err)[-300:]}"
        if not ok and "backend" not in str(err).lower():
            # Stopped before the attention layers asked for a backend (a kernel this image lacks): the
            # flag was never weighed, so this run shows nothing either way (the CPU tests do).
            rows.append((label, "UNREACHED", note))
            return True
    finally:
        release_engine()
    rows.append((label, "PASS" if ok else "FAIL", note))
    return ok


def run_fallback(family: Family, layout: str, kvs: set[str], model_dir: Path, isolated: bool, rows: list) -> bool:
    """A family whose MLA shapes only vLLM's Triton MLA takes: under `auto` ours hands its decode to that
    kernel, judged against TRITON_MLA (tie rule, every replayed call in float64, the route); with the
    bundled kernels named, start-up stops with the family's reason (in this process: it stops before
    the model is built)."""
    model = family_checkpoint(family, layout, model_dir)
    run = run_engine_isolated if isolated else run_engine
    label = f"{family.name} {layout} ({family.heads[layout]} heads)"
    prompts = make_prompts(0)
    ok_all = True
    for kv in sorted(kvs):
        spec = EngineSpec("CUSTOM", kv, 64, True)
        try:
            ref = run(EngineSpec("TRITON_MLA", kv, 64, True), model, prompts)
            rows.append(reference_row(ref))
            refs = {"TRITON_MLA" + kv: ref}
            result = run(spec, model, prompts)
            keep_tokens(label, spec, result, refs)
            ok, notes = judge(result, refs, "fallback")
        except Exception as err:
            ok, notes = False, [repr(err)[:300]]
        ok_all &= ok
        add_engine_row(rows, label, spec, ok, notes)
    named = EngineSpec("CUSTOM", sorted(kvs)[0], 64, True, mla_backend=OURS)
    ok_all &= start_up_stops(f"{label}: {named.name}", model, named, family, rows)
    return ok_all


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="GLM-4.7-Flash,Kimi-K2,DeepSeek-V2-Lite,Moonlight")
    parser.add_argument("--layouts", default="first", help="first (each family's first layout) or all")
    parser.add_argument("--kv", default="fp8,auto")
    parser.add_argument("--selftest", action="store_true")
    parser.add_argument(
        "--in-process",
        dest="isolated",
        action="store_false",
        help="every engine in this process (Model Runner V1 unless VLLM_USE_V2_MODEL_RUNNER is set); "
        "default: each in a process of its own",
    )
    parser.add_argument("--refusals", action="store_true", help="also start the refused families")
    parser.add_argument("--parts", default="plain", help="plain (greedy, no drafter), drafts, split (see above)")
    parser.add_argument("--tp", type=int, default=2, help="GPUs the split part splits the heads over")
    parser.add_argument("--dcp", default="1,2", help="decode context parallel sizes of the split part")
    parser.add_argument("--draft-tokens", default="1,3", help="k, the draft tokens per step, comma-separated")
    parser.add_argument("--out", default="results/zoo")
    parser.add_argument("--model-dir", default="/tmp/mla_backend_zoo")
    args = parser.parse_args(argv)
    if unknown := set(args.parts.split(",")) - {"plain", "drafts", "split"}:
        parser.error(f"--parts: plain, drafts and split, not {sorted(unknown)}")
    return args


def main() -> int:
    args = parse_args()
    out, model_dir, kvs = Path(args.out), Path(args.model_dir), set(args.kv.split(","))
    parts = set(args.parts.split(","))
    if not args.isolated:  # Model Runner V2 cannot run a second engine in one process
        os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    out.mkdir(parents=True, exist_ok=True)
    setups = (allow_dense_only_glm, skip_longcat_mtp_weights_in_target)
    for setup in setups:
        setup()
    os.environ[SETUP_ENV] = ",".join(f"{s.__module__}:{s.__name__}" for s in setups)  # isolated engines
    rows: list = []
    ok = True
    if args.refusals:  # quick: each stops at start-up
        for family in (f for f in FAMILIES if f.expect == "refused"):
            ok &= refusal(family, model_dir, rows)
    for family, layout in pick(args.families, args.layouts == "all"):
        if family.expect not in ("bundled", "fallback"):
            continue
        if missing := model_import_error(family):
            rows.append((f"{family.name} {layout}", "FAIL", missing))
            ok = False
            continue
        if family.expect == "fallback":
            if "plain" in parts:
                ok &= run_fallback(family, layout, kvs, model_dir, args.isolated, rows)
            continue
        if "plain" in parts:
            ok &= run_family(family, layout, kvs, model_dir, args.selftest, args.isolated, rows)
        if "drafts" in parts:
            draft_tokens = [int(k) for k in args.draft_tokens.split(",")]
            ok &= run_drafts(family, layout, kvs, model_dir, draft_tokens, rows)
        if "split" in parts:
            dcps = [int(d) for d in args.dcp.split(",")]
            ok &= run_split(family, layout, kvs, model_dir, args.tp, dcps, rows)
        (out / "zoo.json").write_text(json.dumps(rows, indent=1))  # a run cut at its limit keeps these
    (out / "zoo.json").write_text(json.dumps(rows, indent=1))
    (out / "zoo_tokens.json").write_text(json.dumps(TOKENS))
    print(f"\n== model zoo ({torch.cuda.get_device_name()}) ==")
    for name, status, notes in rows:
        print(f"{status:10s} {name:60s} {notes}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
