#!/usr/bin/env bash
# What `offload` costs the host at the full Llama-3-8B shape, in one device call: the
# random-weight folder built if absent or too short for CONTEXT (default 16384; timeline_check.sh
# without tests or traces), then benchmarks/offload_copies.py on this code and, with
# OLD_CODE=<tar of an older aner_lang/> (git archive <commit> aner_lang), on that code: per update
# its seconds, the host time of each copy and fetch, torch's pinned-memory allocator counters and
# the GPU peak; per kind of tensor moved, how many. Results under $OUT: copies_{new,old}.json and
# .log. timeline_check.sh then times the steady update of each side (its OLD_CODE).
set -u
mkdir -p "$OUT"
OUT=$OUT TRACE=0 benchmarks/timeline_check.sh > "$OUT/setup.log" 2>&1
source benchmarks/device_env.sh
model=/tmp/train_scale/llama3-8b/model
sides=(new); [[ -n "${OLD_CODE:-}" ]] && sides+=(old)
for side in "${sides[@]}"; do
  root=$PWD
  if [[ $side == old ]]; then
    rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf "$OLD_CODE" -C /tmp/old && root=/tmp/old
  fi
  PYTHONPATH="$root:$PYTHONPATH" timeout "${COPIES_S:-150}" python3 benchmarks/offload_copies.py \
    --model "$model" --context "${CONTEXT:-16384}" --updates "${UPDATES:-4}" \
    --out "$OUT/copies_$side.json" > "$OUT/copies_$side.log" 2>&1
  echo "$side rc=$?"; tail -20 "$OUT/copies_$side.log"
done
free -g | head -2
