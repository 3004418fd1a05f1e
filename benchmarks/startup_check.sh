#!/usr/bin/env bash
# Start-up and a train() call's fixed cost at 8B on one GPU machine, in one device call: three
# short `aner run`s of the 8B shape (the first cold on a fresh machine, the others warm), whose
# start events split the seconds before training (imports, loading, kernel build, train setup),
# then benchmarks/train_fixed_cost.py on the same folder (LoRA r16 on the seven projections,
# context 2048; each call continuing one adapter, then a new adapter per call: FIXED_MODES,
# default "continued fresh"), with the functions that cost the most. E2E_REPEATS (default 3) runs;
# 0 leaves them out and times the fixed cost on timeline_check.sh's folder.
# Arguments, if any, select CUDA tests to run first (gpu_suite.sh --no-bench). Results under
# $OUT: suite.log, *_events.jsonl, startup.txt, fixed_cost.json, fixed_cost_{continued,fresh}.log
# (tests.log, pytest.log); fixed_cost_old.json and *_old*.log for OLD_CODE, logs numbered by
# round where FIXED_ROUNDS > 1.
set -u
if [[ $# -gt 0 ]]; then  # CUDA tests first, where asked (pytest arguments)
  PYTEST_S=${PYTEST_S:-200} benchmarks/gpu_suite.sh --no-bench "$@" > "$OUT/tests.log" 2>&1
  tail -3 "$OUT/pytest.log"
fi
model=/tmp/train_e2e/llama3-8b/model
if [[ ${E2E_REPEATS:-3} == 0 ]]; then  # the fixed cost alone, on timeline_check.sh's folder
  model=/tmp/train_scale/llama3-8b/model
  OLD_CODE="" OUT=$OUT TRACE=0 benchmarks/timeline_check.sh > "$OUT/setup.log" 2>&1  # the folder only
else
  E2E_S=${E2E_S:-260} \
  E2E_ARGS="--sides aner --repeats ${E2E_REPEATS:-3} --updates 10 --every 5 --val-rows 4 --timeout 120" \
    benchmarks/gpu_suite.sh --no-tests --e2e llama3-8b > "$OUT/suite.log" 2>&1
  for f in $(find /tmp/train_e2e -name 'events.jsonl'); do cp "$f" "$OUT/$(basename "$(dirname "$f")")_events.jsonl"; done
fi
for f in "$OUT"/*_events.jsonl; do
  [[ -e $f ]] && { echo "$f"; grep -h -o '"before_start": {[^}]*}' "$f"; }
done > "$OUT/startup.txt"
source benchmarks/device_env.sh
unset PYTHONDONTWRITEBYTECODE  # as gpu_suite.sh does
# one adapter continued (kept graphs), or a new LoRA per call; FIXED_MODES picks. With
# OLD_CODE=<tar of an older aner_lang/> (git archive <commit> aner_lang) each mode runs this code
# and that one in turn, FIXED_ROUNDS times (default 1), each side's reports in its own file.
sides="new"
if [[ -n "${OLD_CODE:-}" ]]; then
  sides="new old"; mkdir -p /tmp/old && tar -xf "$OLD_CODE" -C /tmp/old
fi
for mode in ${FIXED_MODES:-continued fresh}; do
  for round in $(seq "${FIXED_ROUNDS:-1}"); do
    for side in $sides; do
      root=$PWD; tag=""; [[ $side == old ]] && { root=/tmp/old; tag="_old"; }
      log="$OUT/fixed_cost_$mode$tag.log"; [[ ${FIXED_ROUNDS:-1} != 1 ]] && log="${log%.log}_$round.log"
      PYTHONPATH="$root:$PYTHONPATH" timeout "${FIXED_S:-200}" python3 benchmarks/train_fixed_cost.py \
        --device cuda --model "$model" --storage nf4_double_quant --precision bfloat16 \
        --context 2048 --rank 16 --targets q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj \
        --updates 5 --repeats 2 $([[ $mode == continued ]] && echo --continued) --top 40 \
        --out "$OUT/fixed_cost$tag.json" > "$log" 2>&1
      echo "fixed cost ($mode, $side, round $round) rc=$?"
      grep -o 'peak GPU memory [0-9.]* GiB' "$log" | tr '\n' ' '; echo
    done
  done
done
grep -h -o '"recording_seconds": [0-9.]*' /tmp/aner-fixed-cost-*/events*.jsonl | tr '\n' ' '; echo
cat "$OUT/startup.txt"
grep -h -o '"fixed_seconds[^]]*]' "$OUT/fixed_cost.json"
