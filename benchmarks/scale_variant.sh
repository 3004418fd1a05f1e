#!/usr/bin/env bash
# This code beside Unsloth, then a variant of it, in one device call: benchmarks/train_scale.py at
# the full Llama-3-8B shape (CONTEXT, default 16384; SIDES, default aner-offload,unsloth-gc;
# REPEATS, default 2), then VARIANT (a tar of aner_lang/ and, optionally, tests/, made from a
# patch under benchmarks/variants/) unpacked over this copy of the tree and its Aner side
# (VARIANT_SIDE, default aner-offload) run again on the same folder and batches, then the
# variant's CUDA tests (pytest arguments, if any). Results under $OUT: scale_main.json/.log,
# scale_variant.json/.log, env_main.txt and env.txt (the variant's source), pytest.log. The
# variant overwrites this copy's files: run it on the device machine only.
set -u
mkdir -p "$OUT"
args="--activations checkpoint --context ${CONTEXT:-16384} --steps 4 --warmup 1 --compare 4 --repeats ${REPEATS:-2} --timeout ${SIDE_S:-120}"
SCALE_S=${MAIN_S:-300} SIDES=${SIDES:-aner-offload,unsloth-gc} SCALE_ARGS="$args" \
  benchmarks/gpu_suite.sh --no-tests --scale llama3-8b > "$OUT/scale_main.log" 2>&1
mv "$OUT/train_scale.json" "$OUT/scale_main.json"; rm -f "$OUT/train_scale.log"; cp "$OUT/env.txt" "$OUT/env_main.txt"
grep -A8 '^| side' "$OUT/scale_main.log"
tar -xf "$VARIANT"
SCALE_S=${VARIANT_S:-130} SIDES=${VARIANT_SIDE:-aner-offload} SCALE_ARGS="$args" \
  benchmarks/gpu_suite.sh --no-tests --scale llama3-8b > "$OUT/scale_variant.log" 2>&1
mv "$OUT/train_scale.json" "$OUT/scale_variant.json"; rm -f "$OUT/train_scale.log"
grep -A8 '^| side' "$OUT/scale_variant.log"
if [[ $# -gt 0 ]]; then
  PYTEST_S=${PYTEST_S:-90} benchmarks/gpu_suite.sh --no-bench "$@" > /dev/null 2>&1
  tail -3 "$OUT/pytest.log"; rm -f "$OUT/junit.xml"
fi
