#!/usr/bin/env bash
# Where the GPU waits between updates at 8B, in one device call: optional CUDA tests first (pytest
# arguments, through gpu_suite.sh --no-bench), then the random-weight Llama-3-8B folder built if
# absent, its positions raised to CONTEXT where fewer (train_scale.model_for), then
# benchmarks/update_timeline.py on it (CONTEXT, default 2048; ACTIVATIONS, default keep; TRACE=0
# leaves it out). With
# OLD_CODE=<tar of an older aner_lang/> (git archive <commit> aner_lang), the steady update is then
# timed for that code and this one in turn, AB_REPEATS (default 2) times each, UPDATES_AB updates
# a call (default 30), their files named with AB_TAG (default none). Results under $OUT:
# tests.log (setup.log without tests) + pytest.log, env.txt, update_timeline.json + .log,
# ab_{old,new}_N$AB_TAG.json + ab$AB_TAG.log; EAGER=1 adds this code without CUDA graphs
# (eager_N.json, eager.log).
set -u
mkdir -p "$OUT"
if [[ $# -gt 0 ]]; then
  PYTEST_S=${PYTEST_S:-200} benchmarks/gpu_suite.sh --no-bench "$@" > "$OUT/tests.log" 2>&1
  tail -3 "$OUT/pytest.log"
else
  benchmarks/gpu_suite.sh --no-bench --no-tests > "$OUT/setup.log" 2>&1  # wheels and env.txt only
fi
grep source "$OUT/env.txt"
source benchmarks/device_env.sh
unset PYTHONDONTWRITEBYTECODE
model=/tmp/train_scale/llama3-8b/model
python3 -c "import train_scale as t; from pathlib import Path; folder = Path('$model'); \
t.SHAPES['llama3-8b']['context'] = max(${CONTEXT:-2048}, 2048); t.model_for('llama3-8b', folder, 'cuda')"
if [[ ${TRACE:-1} == 1 ]]; then
  timeout "${TIMELINE_S:-240}" python3 benchmarks/update_timeline.py --model "$model" \
    --context "${CONTEXT:-2048}" --activations "${ACTIVATIONS:-keep}" --updates "${UPDATES:-30}" --out "$OUT/update_timeline.json" \
    > "$OUT/update_timeline.log" 2>&1
  echo "timeline rc=$?"; tail -40 "$OUT/update_timeline.log"
fi
if [[ -n "${OLD_CODE:-}" ]]; then
  mkdir -p /tmp/old && tar -xf "$OLD_CODE" -C /tmp/old
  for i in $(seq "${AB_REPEATS:-2}"); do
    for side in old new; do
      root=$PWD; [[ $side == old ]] && root=/tmp/old
      PYTHONPATH="$root:$PYTHONPATH" timeout 120 python3 benchmarks/update_timeline.py \
        --model "$model" --context "${CONTEXT:-2048}" --activations "${ACTIVATIONS:-keep}" --updates "${UPDATES_AB:-30}" --traced 0 \
        --out "$OUT/ab_${side}_$i${AB_TAG:-}.json" 2>&1 | tail -1 | sed "s/^/$side $i: /"
    done
  done | tee "$OUT/ab${AB_TAG:-}.log"
fi
if [[ ${EAGER:-0} == 1 ]]; then  # this code with CUDA graphs off, as often
  for i in $(seq "${AB_REPEATS:-2}"); do
    timeout 120 python3 benchmarks/update_timeline.py --model "$model" --context "${CONTEXT:-2048}" \
      --updates "${UPDATES_AB:-30}" --traced 0 --eager --out "$OUT/eager_$i.json" 2>&1 | tail -1 \
      | sed "s/^/eager $i: /"
  done | tee "$OUT/eager.log"
fi
