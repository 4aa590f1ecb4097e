#!/usr/bin/env bash
# Reproduce the tiny-pystd model pair on CPU, from nothing but this Python's standard library:
#   corpus -> tokenizer -> target -> drafter training data -> (drafter)
#
#   scripts/train_tiny_pair.sh [RUN_DIR]        (default RUN_DIR: runs/tiny-pair, git-ignored)
#
# Environment knobs:
#   THREADS=2          torch threads (on a busy 2-core machine THREADS=1 was as fast and steadier)
#   NUM_SEQS=10240     drafter training continuations
#   INSTALL_ASSETS=1   copy the final target into trtllm_dflash/assets/tiny-pystd/target/
#
# Each step is skipped when its output exists; an interrupted target run resumes from its
# last checkpoint. Outputs: RUN_DIR/{corpus.json, tokenizer/, target/, target.ckpt/,
# drafter-data/}, plus a log per step.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR=${1:-runs/tiny-pair}
THREADS=${THREADS:-2}
NUM_SEQS=${NUM_SEQS:-10240}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # do not spin-wait: the cores are shared
mkdir -p "$RUN_DIR"

echo "[1/4] corpus description -> $RUN_DIR/corpus.json"
python -m trtllm_dflash.train.corpus --out "$RUN_DIR/corpus.json"

if [ ! -f "$RUN_DIR/tokenizer/tokenizer.json" ]; then
  echo "[2/4] tokenizer -> $RUN_DIR/tokenizer"
  python -m trtllm_dflash.train.tokenizer --out "$RUN_DIR/tokenizer" 2>&1 | tee "$RUN_DIR/tokenizer.log"
fi

if [ ! -f "$RUN_DIR/target/model.safetensors" ]; then
  echo "[3/4] target -> $RUN_DIR/target (log: $RUN_DIR/target.log)"
  resume=()
  [ -f "$RUN_DIR/target.ckpt/last.pt" ] && resume=(--resume)
  python -m trtllm_dflash.train.target --tokenizer "$RUN_DIR/tokenizer" --out "$RUN_DIR/target" \
    --threads "$THREADS" "${resume[@]}" 2>&1 | tee -a "$RUN_DIR/target.log"
fi

if [ ! -f "$RUN_DIR/drafter-data/meta.json" ]; then
  echo "[4/4] drafter training data -> $RUN_DIR/drafter-data (log: $RUN_DIR/data.log)"
  python -m trtllm_dflash.train.data --target "$RUN_DIR/target" --out "$RUN_DIR/drafter-data" \
    --num-seqs "$NUM_SEQS" --threads "$THREADS" 2>&1 | tee "$RUN_DIR/data.log"
fi

# ---------------------------------------------------------------------------------------
# DRAFTER STEP: NOT WRITTEN YET. The drafter owner adds the command that trains the DFlash
# drafter from "$RUN_DIR/target" and "$RUN_DIR/drafter-data" here (and its asset copy below).
# ---------------------------------------------------------------------------------------

if [ "${INSTALL_ASSETS:-0}" = "1" ]; then
  dest=trtllm_dflash/assets/tiny-pystd/target
  echo "installing the target into $dest"
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  cp "$RUN_DIR"/target/{model.safetensors,config.json,generation_config.json,tokenizer.json,tokenizer_config.json} "$dest.tmp"/
  cp "$RUN_DIR/corpus.json" "$(dirname "$dest")/corpus.json"
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
fi
