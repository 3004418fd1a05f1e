#!/usr/bin/env bash
# What `offload` costs the host at the full Llama-3-8B shape, in one device call: the
# random-weight folder built if absent or too short for CONTEXT (default 16384; timeline_check.sh
# without tests or traces, and with the pytest arguments given, if any), then
# benchmarks/offload_copies.py on this code and, with CODES="<name>=<code> ..." (each code a tar
# of another aner_lang/, git archive <commit> aner_lang, or a patch of this one, as under
# benchmarks/variants/), on each of those in turn: per update its seconds,
# the host time of each copy and fetch, torch's pinned-memory allocator counters and the GPU
# peak; per kind of tensor moved, how many. Results under $OUT: copies_<name>.json and .log
# (this code's named new; with AGAIN=1 and other codes, this code runs again last, new_again),
# setup.log or tests.log.
set -u
mkdir -p "$OUT"
export CONTEXT=${CONTEXT:-16384}
OUT=$OUT TRACE=0 OLD_CODE="" benchmarks/timeline_check.sh "$@" > "$OUT/setup.log" 2>&1
tail -4 "$OUT/setup.log"
source benchmarks/device_env.sh
model=/tmp/train_scale/llama3-8b/model
sides=("new=$PWD")
for code in ${CODES:-}; do
  name=${code%%=*}; root=/tmp/code_$name
  rm -rf "$root" && mkdir -p "$root"
  case ${code#*=} in
    *.patch) cp -r aner_lang "$root/" && (cd "$root" && git apply --include='aner_lang/*' "$OLDPWD/${code#*=}") ;;
    *) tar -xf "${code#*=}" -C "$root" ;;
  esac && sides+=("$name=$root")
done
# this code once more, last (new, others, new_again)
[[ ${AGAIN:-0} == 1 && ${#sides[@]} -gt 1 ]] && sides+=("new_again=$PWD")
for side in "${sides[@]}"; do
  name=${side%%=*}
  PYTHONPATH="${side#*=}:$PYTHONPATH" timeout "${COPIES_S:-150}" python3 benchmarks/offload_copies.py \
    --model "$model" --context "$CONTEXT" --updates "${UPDATES:-4}" \
    --out "$OUT/copies_$name.json" > "$OUT/copies_$name.log" 2>&1
  echo "$name rc=$?"; tail -"${TAIL:-20}" "$OUT/copies_$name.log"
done
free -g | head -2
