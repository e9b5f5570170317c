#!/usr/bin/env bash
# The GPU measurements of issue #29 as one script, for a machine lent for minutes: a CUDA GPU with
# PyTorch installed and no network (aiayn runs from this checkout, not installed; the peers'
# missing packages come as wheels, see below). Every part writes into OUT as it goes and is cut
# by its own time limit, so a slow part leaves the later ones their time and a stopped run keeps
# what it measured (speed.py's *.running.json). At the default limits all parts take up to 22
# minutes, more than a lent machine's 15: choose the parts, narrow them (below), or lower
# TRAIN_SECONDS and the rest.
#
#   bash benchmarks/gpu_session.sh OUT PART...
#
# AIAYN_REVISION=COMMIT names the revision in the results where the copy has no git history.
#
# PARTs, run in the order given:
#   setup     the GPU, the versions, the wheels of .whl/ installed into /tmp (Eole 0.6.4 and its
#             missing dependencies in .whl/eole, CTranslate2 in .whl/ct2, aiayn's own in .whl/aiayn)
#   train     benchmarks/speed.py: training of base and big at 25,000 and 3,125 tokens per batch,
#             tf32 and bf16, aiayn against torch.nn.Transformer, HF Marian and Eole 0.6.4
#             (BATCHES="25000", PRECISIONS="bf16" and MODELS="base" narrow it)
#   compiled  aiayn's compiled step in bf16 at 25,000 tokens (base and big) beside its eager step
#             (MODELS="base" and BATCHES="3125" change that)
#   profile   benchmarks/profile_train.py: where a bf16 step's GPU time goes (base and big, 25,000;
#             PROFILE_BUDGETS="25000 3125" and MODELS="base" change that)
#   tests     the tests marked cuda but the recipe's, quickest first: the fused attention without
#             cuDNN, TF32 training, a training step without syncs, torchrun with NCCL resuming
#             exactly, decoding with CUDA graphs (tests/test_graphs.py)
#   recipe    the test of the WMT14 recipe on synthetic data on the GPU (300 steps of base)
#   decode    benchmarks/speed.py: beam 4 and greedy at batch 64, aiayn (bf16, fp16, bf16 with
#             CUDA graphs) against HF Marian (bf16) and CTranslate2 (bf16, fp16, int8_float16)
#             (DECODE_SYSTEMS="aiayn ctranslate2" narrows it, DECODE_ONLY="'CUDA graphs' ctranslate2" keeps
#             the cases whose labels hold one of these)
#   decode-mix  benchmarks/decode_mix.py: aiayn's bf16 decoding of 1,000 sentences of the corpus'
#             lengths in batches of many shapes, with CUDA graphs and without (beam 4 and greedy)
#   decode-profile  benchmarks/profile_decode.py: where the time of aiayn's bf16 decoding with CUDA
#             graphs goes, beam 4 and greedy
#
# The wheels (.whl/, ignored by git) are fetched beforehand on a machine with network:
#   bash benchmarks/fetch_gpu_wheels.sh       (benchmarks/README.md lists them)
# and the lent machine's call carries .whl.
set -uo pipefail
OUT="${1:?usage: gpu_session.sh OUT PART...}"
shift
mkdir -p "$OUT"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export PYTHONPATH="$repo" PYTHONUNBUFFERED=1
PYTHON="${PYTHON:-python3}"
LOG="$OUT/session.log"
# Eole runs with its wheels on the path; aiayn's own processes never see them.
EOLE_PYTHON=/tmp/eole-python

say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
# part NAME SECONDS COMMAND...: run, time-limited, output into the log
part() {
    local name="$1" seconds="$2"
    shift 2
    say "$name (limit ${seconds} s): $(printf '%q ' "$@")"
    timeout --signal=INT --kill-after=10 "$seconds" "$@" >>"$LOG" 2>&1
    say "$name: exit status $?"
}

# DECODE_ONLY holds shell words ('CUDA graphs' ctranslate2): split as the shell would, quotes kept.
only=()
if [ -n "${DECODE_ONLY:-}" ] && ! eval "only=(--only $DECODE_ONLY)"; then
    echo "DECODE_ONLY is not a list of shell words: $DECODE_ONLY" >&2
    exit 2
fi

for what in "$@"; do
    case "$what" in
    setup)
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>"$LOG" 2>&1
        "$PYTHON" -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name())" >>"$LOG" 2>&1
        for group in eole ct2 aiayn; do
            "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                --target "/tmp/site-$group" .whl/"$group"/*.whl >>"$LOG" 2>&1 || say "wheels of $group: failed"
        done
        printf '#!/bin/sh\nPYTHONPATH=/tmp/site-eole:/tmp/site-aiayn exec %s "$@"\n' "$PYTHON" >"$EOLE_PYTHON"
        chmod +x "$EOLE_PYTHON"
        # CTranslate2 4.8's CUDA build opens libcublas.so.12; a CUDA 13 machine has .so.13 only.
        found="$(find /opt /usr -name 'libcublas.so.12*' 2>/dev/null | head -1)"
        mkdir -p /tmp/cu12
        if [ -n "$found" ]; then
            say "libcublas 12: $found"
            ln -sf "$found" /tmp/cu12/libcublas.so.12
            ln -sf "$(dirname "$found")"/libcublasLt.so.12* /tmp/cu12/ 2>/dev/null
        else
            blas="$(find /opt /usr -name 'libcublas.so.13*' 2>/dev/null | head -1)"
            lt="$(find /opt /usr -name 'libcublasLt.so.13*' 2>/dev/null | head -1)"
            say "no libcublas 12; trying CUDA 13's under its name: $blas $lt"
            [ -n "$blas" ] && ln -sf "$blas" /tmp/cu12/libcublas.so.12
            [ -n "$lt" ] && ln -sf "$lt" /tmp/cu12/libcublasLt.so.12
        fi
        ;;
    train)
        part train "${TRAIN_SECONDS:-270}" "$PYTHON" benchmarks/speed.py --device cuda --tasks train \
            --systems aiayn torch marian eole --peer-python "eole=$EOLE_PYTHON" --models ${MODELS:-base big} \
            --batches ${BATCHES:-25000 3125} --precisions ${PRECISIONS:-tf32 bf16} --reps "${REPS:-1}" --out "$OUT/speed-train-cuda.json"
        ;;
    compiled)
        part compiled "${COMPILED_SECONDS:-240}" "$PYTHON" benchmarks/speed.py --device cuda --tasks train \
            --systems aiayn --compile --precisions bf16 --models ${MODELS:-base big} --batches ${BATCHES:-25000} --reps "${REPS:-1}" \
            --out "$OUT/speed-train-compiled-cuda.json"
        ;;
    profile)
        for budget in ${PROFILE_BUDGETS:-25000}; do
            for model in ${MODELS:-base big}; do
                part "profile $model $budget" 35 "$PYTHON" benchmarks/profile_train.py --device cuda --model "$model" \
                    --precision bf16 --budget "$budget" --steps 3 --out "$OUT/profile-train-cuda-$model-bf16-$budget.txt"
            done
        done
        ;;
    tests)
        part tests "${TESTS_SECONDS:-120}" env PYTHONPATH="$repo:/tmp/site-aiayn" "$PYTHON" -m pytest -m cuda \
            tests/test_cuda.py::test_fused_attention_on_a_gpu_runs_no_cudnn_kernel_and_equals_the_reference \
            tests/test_cuda.py::test_tf32_training_on_a_gpu_computes_its_products_in_tf32 \
            tests/test_cuda.py::test_a_training_step_on_a_gpu_waits_for_it_once \
            tests/test_cuda.py::test_one_torchrun_process_trains_checkpoints_and_resumes_exactly tests/test_graphs.py \
            -q -rA -p no:cacheprovider
        ;;
    recipe)
        part recipe "${RECIPE_SECONDS:-200}" env PYTHONPATH="$repo:/tmp/site-aiayn" "$PYTHON" -m pytest -m cuda \
            tests/test_cuda.py -k recipe -q -rA -s -p no:cacheprovider
        ;;
    decode)
        part decode "${DECODE_SECONDS:-130}" env PYTHONPATH="$repo:/tmp/site-ct2" \
            LD_LIBRARY_PATH="/tmp/cu12:${LD_LIBRARY_PATH:-}" "$PYTHON" benchmarks/speed.py --device cuda \
            --tasks decode --systems ${DECODE_SYSTEMS:-aiayn marian ctranslate2} --precisions bf16 --reps "${REPS:-1}" \
            "${only[@]}" --out "$OUT/speed-decode-cuda.json"
        ;;
    decode-mix)
        for beam in 4 1; do
            part "decode mix beam $beam" "${MIX_SECONDS:-90}" "$PYTHON" benchmarks/decode_mix.py --device cuda \
                --precision bf16 --beam "$beam" --out "$OUT/decode-mix-cuda-bf16-beam$beam.json"
        done
        ;;
    decode-profile)
        for beam in 4 1; do
            part "decode profile beam $beam" 40 "$PYTHON" benchmarks/profile_decode.py --device cuda --precision bf16 \
                --cuda-graphs --beam "$beam" --out "$OUT/profile-decode-cuda-bf16-beam$beam-graphs.txt"
        done
        ;;
    *)
        say "unknown part $what"
        exit 2
        ;;
    esac
done
say "done"
