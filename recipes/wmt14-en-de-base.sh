#!/usr/bin/env bash
# WMT 2014 English→German with the base Transformer, as the paper trained and scored it:
#   §5.1  4.5M sentence pairs, one shared BPE vocabulary of ~37,000 tokens, batches of
#         ~25,000 source + ~25,000 target tokens per step
#   §5.2  8 GPUs, 100,000 steps
#   §6.1  the average of the last 5 checkpoints, beam 4, length penalty α = 0.6,
#         maximum output length = input length + 50; BLEU on newstest2014
#
# Run it as it is on an 8-GPU machine (WMT14 comes through Hugging Face datasets: pip install
# 'aiayn[hf]', network needed once). Every setting is a variable, so the same sequence runs
# elsewhere: GPUS=4 keeps the paper's 25,000 tokens per step with 2 batches per GPU per step
# (--accumulate); CORPUS may be a folder of WMT14's Parquet files (train-*.parquet,
# validation-*.parquet, test-*.parquet) already on disk. tests/test_cuda.py runs this very
# script on a toy file with 2 CPU processes (and on a GPU, when there is one).
set -euo pipefail

CORPUS="${CORPUS:-wmt14-en-de}"          # a built-in name, or a folder of WMT14 Parquet files
WORK="${WORK:-wmt14-en-de-base}"         # everything goes in here: data/, run/, averaged/, test.hyp.de
GPUS="${GPUS:-8}"
VOCAB_SIZE="${VOCAB_SIZE:-37000}"        # §5.1
MODEL="${MODEL:---preset base}"          # §3 / Table 3's base row
MAX_TOKENS="${MAX_TOKENS:-3125}"         # per GPU and batch: 8 × 3,125 = 25,000 tokens per side per step
STEPS="${STEPS:-100000}"                 # §5.2
SAVE_EVERY="${SAVE_EVERY:-1500}"         # §6.1 checkpoints every 10 minutes; ~1,500 steps at 0.4 s/step
PRECISION="${PRECISION:-bf16}"           # the paper trained in fp32 on P100s; bf16 on today's GPUs
TORCHRUN="${TORCHRUN:-torchrun}"         # add --master-port etc. here for a shared machine

# A whole number first: in (( )) GPUS=0 or 1.5 is an arithmetic error, which `if` takes for false
# (found by a misuse hunt: the corpus was preprocessed, then ACCUMULATE was unbound; -8 passed).
if [[ ! "$GPUS" =~ ^[1-9][0-9]*$ ]] || (( 8 % GPUS != 0 )); then
    echo "GPUS must be 1, 2, 4 or 8, a divisor of the paper's 8 GPUs × 1 batch per step; got '$GPUS'" >&2
    exit 2
fi
ACCUMULATE=$(( 8 / GPUS ))

# Rerun the same command after an interruption (or with a larger STEPS): the data made once is
# kept, training resumes from its last checkpoint, and the average and the test translation, which
# follow from the run, are made anew.
if [[ -d "$CORPUS" ]]; then CORPUS=$(realpath "$CORPUS"); fi  # one folder is one CORPUS, however it is written
if [[ -f "$WORK/data/manifest.json" ]]; then
    echo "data: $WORK/data, made before"
    # (found by a misuse hunt: another VOCAB_SIZE, or CORPUS, was ignored without a word)
    made=$(grep -o '"vocab_size": [0-9]*' "$WORK/data/manifest.json" | grep -o '[0-9]*$' || true)
    if [[ "$made" != "$VOCAB_SIZE" ]]; then
        echo "$WORK/data was made with VOCAB_SIZE=${made:-(none recorded)}, not $VOCAB_SIZE: give its VOCAB_SIZE, or another WORK" >&2
        exit 2
    fi
    made=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get("corpus", ""))' "$WORK/data/manifest.json")
    if [[ "$made" != "$CORPUS" ]]; then
        echo "$WORK/data was made from CORPUS=${made:-(none recorded)}, not $CORPUS: give its CORPUS, or another WORK" >&2
        exit 2
    fi
else
    aiayn preprocess --corpus "$CORPUS" --src-lang en --tgt-lang de --out "$WORK/data" --vocab-size "$VOCAB_SIZE"
fi
if [[ ! -f "$WORK/data/test.en" ]]; then  # found before training, not after it (found by a misuse hunt)
    echo "$WORK/data has no test split, which the recipe translates and scores: give a CORPUS with one" >&2
    exit 2
fi

RESUME=()
if [[ -f "$WORK/run/train_config.json" ]]; then RESUME=(--resume); fi
# shellcheck disable=SC2086  # MODEL and TORCHRUN are lists of arguments
$TORCHRUN --nproc-per-node "$GPUS" -m aiayn train --data "$WORK/data" --out "$WORK/run" $MODEL \
    --max-tokens "$MAX_TOKENS" --accumulate "$ACCUMULATE" --max-steps "$STEPS" \
    --save-every "$SAVE_EVERY" --keep-last 5 --precision "$PRECISION" ${RESUME[@]+"${RESUME[@]}"}

aiayn average "$WORK/run" --last 5 --out "$WORK/averaged" --force
aiayn translate "$WORK/averaged" --input "$WORK/data/test.en" --output "$WORK/test.hyp.de" \
    --beam 4 --alpha 0.6 --precision "$PRECISION" --force
aiayn score --ref "$WORK/data/test.de" --hyp "$WORK/test.hyp.de" --lang de
