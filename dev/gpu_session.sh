#!/usr/bin/env bash
# One engine-level job on a lent GPU machine that has torch but no vLLM and no network.
#
#   PART=parallel KV=fp8 HEADS=32 bash dev/gpu_session.sh
#
# Expects, carried in .gpu/ (git-ignored): the offline vLLM 0.26 bundle (../shared/gpu/README.md),
# the project's wheel in .gpu/dist/ (built here for the GPU's architecture) and any extra wheels in
# .gpu/extra/ (bash dev/make_gpu_extras.sh: what Kimi-Linear and Kimi-K2.5 need beside the bundle;
# dev/bundle_preflight.py checks each family's model imports against them on CPU first). Installs them
# under /tmp (kept while the machine stays warm), then runs PART:
#   sglang (integration/sglang_e2e.py, alone in its call: carry .gpu-sglang, the SGLang bundle of
#     ../shared/gpu/README.md, and .gpu/dist instead of the vLLM bundle; SGL_KV, SGL_PARTS; SGL_PAGES (page
#     sizes, default 1,64: 1 is SGLang's default, its engines start without one); SGL_FAMILIES
#     of the zoo, SGL_LAYOUTS first|all, SGL_REFUSALS=1 for the families SGLang must refuse, SGL_DP=2 for
#     data-parallel attention on two GPUs, SGL_SPEC=k to draft k tokens with the tiny model's MTP layer)
#   | sglang_sparse (integration/sglang_sparse_e2e.py, carried as sglang is: DeepSeek-V3.2 and GLM-5 on
#     SGLang's dsa backend with --dsa-decode-backend mla_backend against its flashmla_sparse / flashmla_kv;
#     SGL_FAMILIES (default DeepSeek-V3.2,GLM-5; Name@heads), SGL_KV (default auto,fp8_e4m3), SGL_PARTS of
#     tokens,check,selftest,serve (serve: sglang.launch_server, needs the bundle's server part from
#     dev/sglang_server_extras.sh; SGL_SERVE_MODES of graphs,eager, its servers of ours); four engines per
#     family and KV dtype, about 80 s each: LIMIT, or DETACH=1)
#   | sglang_faults (integration/sglang_fault_check.py, carried as sglang is, with the bundle's server
#     part from dev/sglang_server_extras.sh: SGL_KV one of fp8_e4m3 and auto, FAULT_PARTS of
#     preemption,aborts,radix, SELFTEST=1)
#   | zoo (integration/zoo_e2e.py: FAMILIES, ZOO_KV, ZOO_PARTS of plain,drafts,split, DRAFT_TOKENS, SELFTEST=1,
#     REFUSALS=1; split on nvidia-h100-x2: ZOO_TP, ZOO_DCP; each engine in a process of its own, which
#     vLLM 0.26's Model Runner V2 needs; IN_PROCESS=1 runs them all in one, on Model Runner V1)
#   | sparse (integration/sparse_e2e.py: DeepSeek-V3.2 and GLM-5 on our sparse backend and indexer against
#     FLASHMLA_SPARSE: FAMILIES, SPARSE_KV of auto,fp8_ds_mla, DRAFT_TOKENS (0: none), SELFTEST=1,
#     REF_CHECK=1: vLLM's sparse backends' calls in float64 too)
#   | serve (FAMILY: a sparse family instead of DeepSeek-V3) | mtp | parallel | correctness | enginebest | enginebest_parallel | realdims | variants | inputs | placement
#   | faults (integration/fault_check.py: FAULT_PARTS of preemption,aborts,prefix,long,soak; BACKEND, SOAK_S, SELFTEST=1;
#     FAMILY a sparse family (DeepSeek-V3.2, GLM-5: parts preemption,aborts,prefix, KV=auto);
#     one or two parts a call, each part starts two or more servers)
#   | gputests (TEST_FILES, default the kernel tests and the peers' grids; their per-case errors in $OUT/grids.jsonl;
#     TREE: run them in a source tree carried in the checkout, e.g. an ignored copy of a branch, whose
#     package builds its kernels here with NVCC_APPEND_FLAGS)
#   | bench | routes | tokenbench (page 64 against one slot id a token and FlashInfer's ragged ids)
#   | sparsebench (sparse decode, top-k 2048 over fp8_ds_mla, against vLLM's FlashMLA sparse decode)
#   | deepgemm (dev/indexer_vs_deepgemm.py: our indexer logits against DeepGEMM's and float64; carry
#     .gpu-deepgemm (bash dev/make_deepgemm_part.sh) beside .gpu: DeepGEMM is then installed into the
#     site, and every vLLM part on that machine scores the DSA indexer with it; KEYS_MAJOR=1 also times
#     other tiles of mla_backend.indexer_triton, rows-major and keys-major; INDEXER_HEADS=32: GLM-5's)
#   | profile (Nsight Compute on ours and FlashMLA at SHAPE="heads batch seq [q_len]", FP8, and on the
#     wheel in .gpu/ab/ as ours_base where carried: two builds of ours side by side; reports in $OUT)
#   | ab (our times, dev/time_ours.py, alternating the wheel in .gpu/ab/ (base) and .gpu/dist/, 3 rounds)
#   | abbuilds (the same for kernel builds JIT-compiled here: AB_BUILDS="name|tree|nvcc flags;..." with
#     tree a source tree carried in the checkout (. or an ignored copy of another commit), its flags
#     relative to it, e.g. SM120's build emulated on the Hopper (dev/profiles/sm120_on_sm90.h) before
#     and after a change: AB_BUILDS="base|.ab-base|-include dev/profiles/sm120_on_sm90.h;new|.|-include
#     dev/profiles/sm120_on_sm90.h" AB_ENV="MLA_BACKEND_FP8_QK=e4m3 MLA_BACKEND_FP8_PV=f16"; AB_ENV for
#     settings all builds share;
#     AB_SCRIPT another timer than dev/time_ours.py taking the same SHAPES, e.g. dev/kernel_breakdown.py;
#     AB_ROUNDS interleaved rounds (3);
#     a build made here ahead of time into .gpu/abcache/<name> (MLA_BACKEND_CACHE_DIR, the same tree
#     and NVCC_APPEND_FLAGS) is used instead of compiling on the GPU)
#   | script (runs python3 $SCRIPT: a one-off probe on the installed wheel)
#   | sanitize (tests/sanitize_decode.py under compute-sanitizer: SANITIZE_TOOLS, default memcheck,racecheck,synccheck;
#     TREE as for gputests, its package first on the path)
#   | dp (integration/dp_e2e.py on two GPUs: vllm serve --data-parallel-size 2 --enable-expert-parallel,
#     HEADS one or more (128,16: a run each), KV one or both of fp8,auto, SELFTEST=1; needs vLLM's MoE
#     kernels, stashed as below)
# (several, comma-separated, run in turn; routes writes the SM90 route table into the installed
# wheel, so a later enginebest part in the same call runs on it).
# Logs go to $OUT (the lent machine's result folder) or results/.
#
# A job longer than one device command (the 10-minute soak): DETACH=1 starts it in a process session
# of its own, which outlives the command while the machine stays held, and waits up to WAIT_S for it;
# PART=collect (the next call, within the machine's 30 s of idle) waits again and brings the results
# back as detached.tgz beside run.txt. Keep WAIT_S well under the call's limit, which status's
# budget_left_s cuts (on one GPU the limit is about budget_left_s less the start): a call killed at
# its limit returns nothing.
#   DETACH=1 WAIT_S=540 LIMIT=1000 PART=faults FAULT_PARTS=soak SOAK_S=600 bash dev/gpu_session.sh
#   PART=collect WAIT_S=300 bash dev/gpu_session.sh
#
# vLLM's MoE kernels (`_moe_C`, left out of the bundle) do not fit beside it in one transfer: build
# them once here (bash dev/make_moe_part.sh -> .gpu-moe/, ~19 MiB), then two calls in a row, the
# second within the machine's 30 s of idle. PART=stash (carry .gpu-moe only) keeps the part in
# /tmp/moe_stash; every later call (carry .gpu) unpacks it into /tmp/site/vllm once the bundle is there.
#   PART=stash bash dev/gpu_session.sh                               (carry: .gpu-moe)
#   PART=dp HEADS=128 KV=fp8 SELFTEST=1 bash dev/gpu_session.sh       (carry: .gpu; nvidia-h100-x2)
set -uo pipefail
DETACHED=/tmp/gpu_session_detached
if [ "${DETACH:-}" = 1 ]; then
  rm -rf "$DETACHED" && mkdir -p "$DETACHED"
  DETACH='' OUT=$DETACHED setsid nohup bash -c "bash '$0' >'$DETACHED/run.txt' 2>&1; touch '$DETACHED/DONE'" \
    </dev/null >/dev/null 2>&1 &
  PART=collect
fi
if [ "$PART" = collect ]; then
  for ((waited = 0; waited < ${WAIT_S:-300}; waited += 10)); do
    [ -f "$DETACHED/DONE" ] && break
    sleep 10
  done
  # One archive and the log: at most 8 files come back from the lent machine's $OUT. The seeded
  # checkpoints stay behind: they are rewritten from their seeds and would push the archive over the limit.
  mkdir -p "${OUT:-results}" && tar czf "${OUT:-results}/detached.tgz" --exclude='*.safetensors' -C "$DETACHED" . \
    && cp "$DETACHED/run.txt" "${OUT:-results}/"
  tail -n 40 "$DETACHED/run.txt"
  if [ -f "$DETACHED/DONE" ]; then echo "detached job done"; else echo "detached job still running"; fi
  exit 0
fi
MOE_STASH=${MOE_STASH:-/tmp/moe_stash}
MOE_PART=vllm026_moe_C_sm90only.tar.xz
if [ "$PART" = stash ]; then  # alone in its call: no bundle needed, none installed
  [ -f ".gpu-moe/$MOE_PART" ] || { echo "carry .gpu-moe (bash dev/make_moe_part.sh)" >&2; exit 1; }
  (cd .gpu-moe && sha256sum -c SHA256SUMS) || exit 1
  rm -rf "$MOE_STASH" && mkdir -p "$MOE_STASH" && cp ".gpu-moe/$MOE_PART" .gpu-moe/SHA256SUMS "$MOE_STASH/"
  echo "stashed $(du -h "$MOE_STASH/$MOE_PART" | cut -f1) in $MOE_STASH: the next call (carrying .gpu) installs it"
  exit 0
fi
# The MoE part into an installed bundle ($1, the site folder): from .gpu-moe where carried, else the stash.
install_moe() {
  local from=.gpu-moe
  [ -f "$from/$MOE_PART" ] || from=$MOE_STASH
  [ -f "$from/$MOE_PART" ] && [ ! -f "$1/vllm/_moe_C_stable_libtorch.abi3.so" ] || return 0
  xz -dc "$from/$MOE_PART" | tar -x -C "$1" --strip-components=1 --no-same-owner && echo "MoE kernels from $from"
}
OUT=$(mkdir -p "${OUT:-results}" && cd "${OUT:-results}" && pwd)
HEADS=${HEADS:-16}
KV=${KV:-fp8}
LIMIT=${LIMIT:-560}

if [[ "$PART" == sglang* ]]; then  # SGLang cannot share a site with vLLM 0.26: its own bundle, carried alone
  [ -d /tmp/sgl_site/sglang ] || bash .gpu-sglang/install_sglang_on_gpu.sh .gpu-sglang /tmp/sgl_site >/dev/null || exit 1
  # shellcheck disable=SC1091
  source /tmp/sgl_site/env.sh
else
  [ -d /tmp/site/vllm ] || bash .gpu/install_on_gpu.sh .gpu /tmp/site >/dev/null || exit 1
  install_moe /tmp/site || exit 1
  # DeepGEMM where carried (vLLM's DSA indexer then scores with it): dev/install_deepgemm_on_gpu.sh
  if [ -d .gpu-deepgemm ] && [ ! -d /tmp/site/deep_gemm ]; then
    bash dev/install_deepgemm_on_gpu.sh .gpu-deepgemm /tmp/site || exit 1
  fi
  # shellcheck disable=SC1091
  source /tmp/site/env.sh
fi
if compgen -G ".gpu/extra/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/extra/*.whl 2>/dev/null
elif [[ "$PART" != sglang* ]]; then
  echo "no .gpu/extra: vLLM cannot import Kimi-Linear's or Kimi-K2.5's model (bash dev/make_gpu_extras.sh)"
fi
# Reinstalled only when the wheel changed: a route table written by an earlier call stays.
if ! cmp -s .gpu/dist/mla_backend-*.whl /tmp/mla.whl; then
  rm -rf /tmp/mla && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mla .gpu/dist/mla_backend-*.whl
  cp .gpu/dist/mla_backend-*.whl /tmp/mla.whl
fi
export PYTHONPATH=/tmp/mla:$PYTHONPATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
# Kernel variants built here ahead of time (python -m mla_backend build --fp8-pv f16 ...), if carried.
rm -rf /tmp/mla_cache && mkdir -p /tmp/mla_cache && { [ -d .gpu/cache ] && cp -r .gpu/cache/. /tmp/mla_cache/; }
export MLA_BACKEND_CACHE_DIR=/tmp/mla_cache
# Where gputests and sanitize build a carried tree's kernels: kept while the machine stays warm, since
# a cached build answers only the same sources and NVCC_APPEND_FLAGS (jit.build_cached, from 50f1d05;
# a tree older than that must not be run twice with different flags on one warm machine).
TREE_CACHE=$MLA_BACKEND_CACHE_DIR
if [ -n "${TREE:-}" ]; then TREE_CACHE=/tmp/mla_tree_cache; fi
# NCCL only: no NVLink multicast (the lent multi-GPU machines do not support it).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 VLLM_ALLREDUCE_USE_SYMM_MEM=0
# The lent machine's copy of .git can lag the working tree it gets: CHECKOUT=$(git rev-parse --short HEAD),
# set in the command here, names the tree the run used.
echo "wheel built at $(cat .gpu/dist/BUILT_AT 2>/dev/null), checkout ${CHECKOUT:-$(git rev-parse --short HEAD 2>/dev/null) (from the copied .git)}"
nvidia-smi --query-gpu=name --format=csv,noheader

# A part cut by LIMIT says so in the log: its engines' own output stops mid-run without a word.
run() {
  timeout "$LIMIT" "$@" 2>&1 | tee -a "$OUT/log.txt"
  local rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && echo "!! $1 ${2:-} stopped at LIMIT=${LIMIT}s: raise LIMIT (DETACH=1 for longer than a call)" | tee -a "$OUT/log.txt"
  return "$rc"
}
# The wheel in .gpu/ab/ (a second build of ours, "base") into /tmp/mla_base, for the parts that set
# one build against the other.
install_base() {
  rm -rf /tmp/mla_base && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/mla_base .gpu/ab/*.whl
}
REPO=$PWD
for part in ${PART//,/ }; do
  echo "== $part" | tee -a "$OUT/log.txt"
  case $part in
    serve) run python3 integration/serve_check.py --heads "$HEADS" --kv "$KV" ${FAMILY:+--family "$FAMILY"} --out "$OUT" ;;
    faults) run python3 integration/fault_check.py --heads "$HEADS" ${FAMILY:+--family "$FAMILY"} --kv "$KV" --backend "${BACKEND:-auto}" --parts "${FAULT_PARTS:-preemption,aborts,prefix,long}" --soak-s "${SOAK_S:-240}" ${SELFTEST:+--selftest} --out "$OUT/faults" ;;
    mtp | parallel | correctness | enginebest | enginebest_parallel)
      parts=$part; seeds=0
      [ "$part" = correctness ] && parts=correctness,selftest
      [ "$part" = parallel ] && seeds=0,1
      run python3 integration/run_e2e.py --heads "$HEADS" --parts "$parts" --kv "$KV" --prompt-seeds "$seeds" --out "$OUT" ;;
    zoo) run python3 integration/zoo_e2e.py --families "${FAMILIES:-GLM-4.7-Flash,Kimi-K2}" --kv "${ZOO_KV:-fp8,auto}" \
      --parts "${ZOO_PARTS:-plain}" --draft-tokens "${DRAFT_TOKENS:-1,3}" --tp "${ZOO_TP:-2}" --dcp "${ZOO_DCP:-1,2}" \
      ${SELFTEST:+--selftest} ${REFUSALS:+--refusals} ${IN_PROCESS:+--in-process} --out "$OUT" ;;
    sparse) run python3 integration/sparse_e2e.py --families "${FAMILIES:-DeepSeek-V3.2,GLM-5}" \
      --kv "${SPARSE_KV:-auto,fp8_ds_mla}" --draft-tokens "${DRAFT_TOKENS:-0}" ${SELFTEST:+--selftest} \
      ${REF_CHECK:+--check-references} --out "$OUT" ;;
    sglang)
      models=(--heads "$HEADS")
      [ -n "${SGL_FAMILIES:-}" ] && models=(--families "$SGL_FAMILIES" --layouts "${SGL_LAYOUTS:-first}")
      run python3 integration/sglang_e2e.py "${models[@]}" ${SGL_REFUSALS:+--refusals} --kv "${SGL_KV:-fp8_e4m3,auto}" \
        --dp-attention "${SGL_DP:-1}" --spec-tokens "${SGL_SPEC:-0}" --page-sizes "${SGL_PAGES:-1,64}" \
        --references "${SGL_REFS:-triton}" --parts "${SGL_PARTS:-tokens,check,selftest}" --out "$OUT/sglang" ;;
    sglang_sparse) run python3 integration/sglang_sparse_e2e.py --families "${SGL_FAMILIES:-DeepSeek-V3.2,GLM-5}" \
      --kv "${SGL_KV:-auto,fp8_e4m3}" --parts "${SGL_PARTS:-tokens,check,selftest}" \
      --serve-modes "${SGL_SERVE_MODES:-graphs,eager}" --out "$OUT/sglang_sparse" ;;
    sglang_faults) run python3 integration/sglang_fault_check.py --heads "$HEADS" --kv "${SGL_KV:-fp8_e4m3}" \
      --parts "${FAULT_PARTS:-preemption,aborts,radix}" ${SELFTEST:+--selftest} --out "$OUT/sglang_faults" ;;
    realdims) run python3 integration/real_dims.py --heads "$HEADS" --kv "$KV" --out "$OUT" ;;
    variants) run python3 dev/variant_error.py ;;
    inputs) run python3 dev/input_ab.py ;;
    placement) run python3 dev/placement_mechanism.py ;;
    profile)  # ours from .gpu/dist, FlashMLA, and ours from .gpu/ab (as ours_base) where carried
      ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      runs=(ours flashmla)
      if compgen -G ".gpu/ab/*.whl" >/dev/null; then
        install_base
        runs+=(ours_base)
      fi
      for name in "${runs[@]}"; do
        lib=/tmp/mla; [ "$name" = ours_base ] && lib=/tmp/mla_base
        PYTHONPATH=$lib:${PYTHONPATH#/tmp/mla:} run "$ncu" --nvtx --nvtx-include "profile/" --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section LaunchStats \
          --section SchedulerStats --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
          python3 dev/profile_shape.py "${name%_base}" ${SHAPE:-16 128 16384} >"$OUT/ncu_$name.txt"
      done ;;
    ab)
      install_base
      for round in 1 2 3; do
        for side in base new; do
          lib=/tmp/mla; [ $side = base ] && lib=/tmp/mla_base
          PYTHONPATH=$lib:${PYTHONPATH#/tmp/mla:} run python3 dev/time_ours.py ${SHAPES:-} | sed "s/^/$side r$round /"
        done
      done ;;
    abbuilds)
      IFS=';' read -ra builds <<<"$AB_BUILDS"
      for build in "${builds[@]}"; do  # builds made on a CPU machine ahead of time, if carried
        name=${build%%|*}
        [ -d ".gpu/abcache/$name" ] && rm -rf "/tmp/abbuild_$name" && cp -r ".gpu/abcache/$name" "/tmp/abbuild_$name"
      done
      for ((round = 1; round <= ${AB_ROUNDS:-3}; round++)); do
        for build in "${builds[@]}"; do
          IFS='|' read -r name tree flags <<<"$build"
          # The tree's package first: it ships no prebuilt library, so its kernels build here with the flags.
          (cd "$tree" && env ${AB_ENV:-} MLA_BACKEND_CACHE_DIR="/tmp/abbuild_$name" NVCC_APPEND_FLAGS="$flags" \
            PYTHONPATH="$PWD:${PYTHONPATH#/tmp/mla:}" timeout "$LIMIT" python3 "$REPO/${AB_SCRIPT:-dev/time_ours.py}" ${SHAPES:-} 2>&1) |
            sed "s/^/$name r$round /" | tee -a "$OUT/log.txt"
        done
      done ;;
    script) run python3 "$SCRIPT" ;;
    sanitize)
      sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
      tools=${SANITIZE_TOOLS:-memcheck,racecheck,synccheck}
      for tool in ${tools//,/ }; do
        (cd "${TREE:-.}" && PYTHONPATH=${TREE:+$PWD:}$PYTHONPATH MLA_BACKEND_CACHE_DIR=$TREE_CACHE \
          run "$sanitizer" --tool "$tool" --error-exitcode 3 \
          python3 tests/sanitize_decode.py)
        echo "sanitize $tool: rc $?" | tee -a "$OUT/log.txt"
      done ;;
    dp) for heads in ${HEADS//,/ }; do  # one layout after another: HEADS=128,16
        run python3 integration/dp_e2e.py --heads "$heads" --kv "$KV" ${SELFTEST:+--selftest} --out "$OUT/dp"
      done ;;
    gputests)
      (cd "${TREE:-.}" && MLA_BACKEND_CACHE_DIR=$TREE_CACHE \
        PEER_GRID_REPORT=$OUT/grids.jsonl run python3 -m pytest -q -m gpu -p no:cacheprovider \
        ${TEST_FILES:-tests/test_decode_gpu.py tests/test_peer_grids_gpu.py} ${TESTS:+-k "$TESTS"}) ;;
    # From /tmp, so that the installed wheel (not the checkout) is the package measured and written.
    bench) (cd /tmp && run python3 -m mla_backend bench ${QUICK:+--quick} --out "$OUT/bench") ;;
    routes) (cd /tmp && run python3 -m mla_backend bench --route-table --write --out "$OUT/bench") ;;
    tokenbench) (cd /tmp && run python3 -m mla_backend bench --token-indexed) ;;
    sparsebench) (cd /tmp && run python3 -m mla_backend bench --sparse) ;;
    deepgemm) PYTHONPATH=$REPO:$REPO/tests:$PYTHONPATH run python3 dev/indexer_vs_deepgemm.py ${KEYS_MAJOR:+--keys-major} ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
cd "$REPO"
