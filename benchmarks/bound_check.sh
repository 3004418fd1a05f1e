#!/usr/bin/env bash
# The steady step against its floor, in one device call: train_scale.py at the full Llama-3-8B
# shape, Aner (`keep`) beside Unsloth, two repeats (CONTEXT, default 2048), then step_bound.py on
# the same GPU with that run as --against: the cuBLAS products and attention of one update, and
# the step time 1.5x each Unsloth rate needs. Results under $OUT: suite.log, train_scale.log +
# .json, env.txt, step_bound.json + .log.
set -u
context=${CONTEXT:-2048}
SCALE_S=${SCALE_S:-420} SIDES=${SIDES:-aner,unsloth} SCALE_ARGS="--context $context --steps 10 \
  --warmup 2 --compare 20 --repeats 2 --timeout 150" \
  benchmarks/gpu_suite.sh --no-tests --scale llama3-8b > "$OUT/suite.log" 2>&1
echo "train_scale rc=$?"; head -4 "$OUT/train_scale.log"
source benchmarks/device_env.sh
timeout "${BOUND_S:-150}" python3 benchmarks/step_bound.py --shape llama3-8b --context "$context" \
  --against "$OUT/train_scale.json" --out "$OUT/step_bound.json" > "$OUT/step_bound.log" 2>&1
echo "step_bound rc=$?"
python3 - "$OUT/step_bound.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(r["gpu"], r["ceilings"], r["attention"], json.dumps(r["floor"]))
for row in r.get("against", []):
    print(row)
PY
