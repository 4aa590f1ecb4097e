#!/usr/bin/env bash
# Reproduce the tiny-pystd model pair on CPU, from nothing but this Python's standard library:
#   corpus -> tokenizer -> target -> drafter training data -> DFlash drafter -> AR draft (baseline)
#
#   scripts/train_tiny_pair.sh [RUN_DIR]        (default RUN_DIR: runs/tiny-pair, git-ignored)
#
# Environment knobs:
#   THREADS=2          torch threads (on a busy 2-core machine THREADS=1 was as fast and steadier)
#   NUM_SEQS=10240     drafter training continuations
#   DRAFTER_STEPS=6000 DFlash drafter optimizer steps (8 sequences x 64 blocks each)
#   INSTALL_ASSETS=1   copy the final target, drafter and AR draft into trtllm_dflash/assets/tiny-pystd/
#
# Each step is skipped when its output exists; an interrupted target or drafter run resumes
# from its last checkpoint. Outputs: RUN_DIR/{corpus.json, tokenizer/, target/, target.ckpt/,
# drafter-data/, drafter/, drafter.ckpt/, ar-draft/}, plus a log per step.
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_DIR=${1:-runs/tiny-pair}
THREADS=${THREADS:-2}
NUM_SEQS=${NUM_SEQS:-10240}
DRAFTER_STEPS=${DRAFTER_STEPS:-6000}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}  # do not spin-wait: the cores are shared
mkdir -p "$RUN_DIR"

echo "[1/6] corpus description -> $RUN_DIR/corpus.json"
python -m trtllm_dflash.prompts.corpus --out "$RUN_DIR/corpus.json"

if [ ! -f "$RUN_DIR/tokenizer/tokenizer.json" ]; then
  echo "[2/6] tokenizer -> $RUN_DIR/tokenizer"
  python -m trtllm_dflash.train.tokenizer --out "$RUN_DIR/tokenizer" 2>&1 | tee "$RUN_DIR/tokenizer.log"
fi

if [ ! -f "$RUN_DIR/target/model.safetensors" ]; then
  echo "[3/6] target -> $RUN_DIR/target (log: $RUN_DIR/target.log)"
  resume=()
  [ -f "$RUN_DIR/target.ckpt/last.pt" ] && resume=(--resume)
  python -m trtllm_dflash.train.target --tokenizer "$RUN_DIR/tokenizer" --out "$RUN_DIR/target" \
    --threads "$THREADS" "${resume[@]}" 2>&1 | tee -a "$RUN_DIR/target.log"
fi

if [ ! -f "$RUN_DIR/drafter-data/meta.json" ]; then
  echo "[4/6] drafter training data -> $RUN_DIR/drafter-data (log: $RUN_DIR/data.log)"
  python -m trtllm_dflash.train.data --target "$RUN_DIR/target" --out "$RUN_DIR/drafter-data" \
    --num-seqs "$NUM_SEQS" --threads "$THREADS" 2>&1 | tee "$RUN_DIR/data.log"
fi

if [ ! -f "$RUN_DIR/drafter/model.safetensors" ]; then
  echo "[5/6] DFlash drafter -> $RUN_DIR/drafter (log: $RUN_DIR/drafter.log)"
  resume=()
  [ -f "$RUN_DIR/drafter.ckpt/last.pt" ] && resume=(--resume)
  trtllm-dflash train-drafter --target "$RUN_DIR/target" --data "$RUN_DIR/drafter-data" --out "$RUN_DIR/drafter" \
    --layers 1 --intermediate-size 1024 --block-size 16 --init random \
    --steps "$DRAFTER_STEPS" --lr 2e-3 --warmup-steps 100 --schedule wsd --decay-fraction 0.2 \
    --seqs-per-step 8 --anchors 64 --eval-every 250 --eval-prompts 16 --eval-new-tokens 128 \
    --threads "$THREADS" --no-progress "${resume[@]}" 2>&1 | tee -a "$RUN_DIR/drafter.log"
fi

if [ ! -f "$RUN_DIR/ar-draft/model.safetensors" ]; then
  echo "[6/6] AR draft model for the HF assisted-generation baseline -> $RUN_DIR/ar-draft"
  python -m trtllm_dflash.train.ar_draft --target "$RUN_DIR/target" --data "$RUN_DIR/drafter-data" \
    --out "$RUN_DIR/ar-draft" --layers 1 --steps 800 --threads "$THREADS" 2>&1 | tee "$RUN_DIR/ar-draft.log"
fi

# install PART FILE...: replace trtllm_dflash/assets/tiny-pystd/PART with those files of RUN_DIR/PART
install() {
  local part=$1 dest=trtllm_dflash/assets/tiny-pystd/$1
  shift
  echo "installing the $part into $dest"
  rm -rf "$dest.tmp" && mkdir -p "$dest.tmp"
  for f in "$@"; do cp "$RUN_DIR/$part/$f" "$dest.tmp"/; done
  rm -rf "$dest" && mv "$dest.tmp" "$dest"
}

if [ "${INSTALL_ASSETS:-0}" = "1" ]; then
  install target model.safetensors config.json generation_config.json tokenizer.json tokenizer_config.json
  install drafter model.safetensors config.json training.json
  install ar-draft model.safetensors config.json generation_config.json training.json
  cp "$RUN_DIR/corpus.json" trtllm_dflash/assets/tiny-pystd/corpus.json
fi
