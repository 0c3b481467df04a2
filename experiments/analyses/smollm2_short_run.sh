#!/usr/bin/env bash
# A short CPU run on the SmolLM2 pair (experiments/results/smollm2/): the 30-layer teacher fine-tuned
# on the embedded multi-step task, then SFT, KD, DistiLLM and MGSR students cut from the released
# model (6 of 30 layers), the same steps and validation-based checkpoint for each, and every model
# (the truncated initialisation included) evaluated on the test split over sampling seeds. Then the
# peers' protocol: every method continues from the SFT student for CONTINUE more steps (SFT included,
# so all have the same total), evaluated the same way.
#
#   make install-smollm2 && bash experiments/analyses/smollm2_short_run.sh [STEPS] [OUT] [CONTINUE]
#
# Two training processes run at a time, one torch thread each (a 2-core machine).
set -euo pipefail
STEPS=${1:-200}
OUT=${2:-runs/smollm2-short}
CONTINUE=${3:-100}
PY=${PY:-.venv/bin/python}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
ROOT=${MGSR_SMOLLM2_DIR:-artifacts/smollm2}
COMMON=(--config configs/common/cpu.yaml --trainer.max_steps="$STEPS" --trainer.val_check_interval=100
        --model.init_args.validation.rouge_examples=64)
FROM_TUNED=(--model.init_args.teacher.name_or_path="$ROOT/teacher_sft")
mkdir -p "$OUT"

$PY -m mgsr_lightning prepare-smollm2
# the teacher (exported to $ROOT/teacher_sft) and the SFT student, which needs no teacher
$PY -m mgsr_lightning fit --config configs/smollm2/teacher.yaml "${COMMON[@]}" > "$OUT/teacher.log" 2>&1 &
$PY -m mgsr_lightning fit --config configs/smollm2/sft.yaml "${COMMON[@]}" > "$OUT/sft.log" 2>&1 &
wait
# the distilled students, from the fine-tuned teacher
$PY -m mgsr_lightning fit --config configs/smollm2/mgsr.yaml "${COMMON[@]}" "${FROM_TUNED[@]}" > "$OUT/mgsr.log" 2>&1 &
( $PY -m mgsr_lightning fit --config configs/smollm2/kd.yaml "${COMMON[@]}" "${FROM_TUNED[@]}" > "$OUT/kd.log" 2>&1
  $PY -m mgsr_lightning fit --config configs/smollm2/distillm.yaml "${COMMON[@]}" "${FROM_TUNED[@]}" > "$OUT/distillm.log" 2>&1 ) &
wait

# the truncated initialisation every student starts from, saved so that `evaluate` can load it
$PY - "$ROOT" "$OUT/init" <<'EOF'
import sys
from transformers import AutoTokenizer
from mgsr_lightning.models.loading import ModelSource, load_causal_lm
root, out = sys.argv[1], sys.argv[2]
load_causal_lm(ModelSource(name_or_path=f"{root}/teacher", keep_layers=6)).save_pretrained(out)
AutoTokenizer.from_pretrained(f"{root}/teacher").save_pretrained(out)
EOF

RUNS=${MGSR_RUNS_DIR:-runs}/smollm2
$PY -m mgsr_lightning evaluate --preset smollm2 --sets "[$ROOT/data/test.jsonl]" --seeds '[10,20,30]' \
    --out "$OUT/eval" --model "[$ROOT/teacher_sft,$OUT/init,$RUNS/sft/hf,$RUNS/kd/hf,$RUNS/distillm/hf,$RUNS/mgsr/hf]"
$PY -m mgsr_lightning table --runs "[$OUT/eval]" --out "$OUT/table"

# the peers' protocol (DistiLLM and MiniLLM distil an SFT-initialised student): every method, SFT
# included, continues from the SFT student for CONTINUE steps, under runs/from_sft
CONTINUED=(--config configs/common/cpu.yaml --trainer.max_steps="$CONTINUE" --trainer.val_check_interval=$((CONTINUE / 2))
           --model.init_args.validation.rouge_examples=64 --model.init_args.student="{\"name_or_path\": \"$RUNS/sft/hf\"}")
FROM_SFT=${MGSR_RUNS_DIR:-runs}/from_sft
MGSR_RUNS_DIR=$FROM_SFT $PY -m mgsr_lightning fit --config configs/smollm2/mgsr.yaml "${CONTINUED[@]}" "${FROM_TUNED[@]}" > "$OUT/from_sft_mgsr.log" 2>&1 &
( MGSR_RUNS_DIR=$FROM_SFT $PY -m mgsr_lightning fit --config configs/smollm2/sft.yaml "${CONTINUED[@]}" > "$OUT/from_sft_sft.log" 2>&1
  MGSR_RUNS_DIR=$FROM_SFT $PY -m mgsr_lightning fit --config configs/smollm2/distillm.yaml "${CONTINUED[@]}" "${FROM_TUNED[@]}" > "$OUT/from_sft_distillm.log" 2>&1
  MGSR_RUNS_DIR=$FROM_SFT $PY -m mgsr_lightning fit --config configs/smollm2/kd.yaml "${CONTINUED[@]}" "${FROM_TUNED[@]}" > "$OUT/from_sft_kd.log" 2>&1 ) &
wait
S=$FROM_SFT/smollm2
$PY -m mgsr_lightning evaluate --preset smollm2 --sets "[$ROOT/data/test.jsonl]" --seeds '[10,20,30]' \
    --out "$OUT/eval_from_sft" --model "[$S/sft/hf,$S/kd/hf,$S/distillm/hf,$S/mgsr/hf]"
$PY -m mgsr_lightning table --runs "[$OUT/eval_from_sft]" --out "$OUT/table_from_sft"
