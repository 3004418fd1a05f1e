#!/usr/bin/env bash
# Checkpoint stalls on a fresh machine: the CUDA tests that cover snapshots and resumes, then two
# short 8B runs right after the benchmark writes the model folder (the first while the disk
# flushes it), sampling the host's dirty pages beside them. Results under $OUT.
set -u
( while true; do echo "$(date +%T.%N | cut -c1-12) $(grep -E '^(Dirty|Writeback):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"; sleep 0.5; done ) > "$OUT/dirty.log" &
sampler=$!
PYTEST_S=${PYTEST_S:-240} E2E_S=${E2E_S:-300} \
E2E_ARGS="--sides aner --repeats 2 --updates 10 --every 5 --val-rows 4 --timeout 200" \
  benchmarks/gpu_suite.sh --e2e llama3-8b -m cuda "$@" > "$OUT/suite.log" 2>&1
rc=$?
for f in $(find /tmp/train_e2e -name 'events.jsonl'); do cp "$f" "$OUT/$(basename "$(dirname "$f")")_events.jsonl"; done
kill $sampler
grep -h -o '"update": [0-9]*, [^{]*"checkpoint_seconds[^}]*' "$OUT"/*_events.jsonl | sed 's/"loss".*"checkpoint_seconds"/checkpoint_seconds/'
tail -5 "$OUT/pytest.log"
exit $rc
