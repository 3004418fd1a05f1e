#!/usr/bin/env bash
# Runs a command with OUT pointed at a scratch folder and packs that folder into one tar in the
# real $OUT every 15 s and at the end. A device call returns at most 8 files, and one cut short by
# its time limit returns only what is already under $OUT: this way it returns what was measured.
#   benchmarks/returning.sh NAME COMMAND [ARGS...]     ->  $OUT/NAME.tgz
set -u
name=$1; shift
real=${OUT:?OUT must be set}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
command=""
pack() { tar -czf "$real/$name.tmp.tgz" -C "$scratch" . && mv "$real/$name.tmp.tgz" "$real/$name.tgz"; }
# The packer leaves at once while it sleeps (its sleep too, which would otherwise hold the
# call's output open), and after its tar while it packs, so the last pack never writes the same
# temporary tar beside it.
(
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do sleep "${PACK_EVERY_S:-15}" & nap=$!; wait "$nap"; pack; done
) &
packer=$!
last() { kill "$packer" 2>/dev/null; wait "$packer"; pack; rm -rf "$scratch"; }
# stopped (a `timeout` around this script): stop the command, pack once more
trap 'kill "$command" 2>/dev/null; last; exit 143' TERM INT
OUT=$scratch "$@" &
command=$!
wait "$command"
rc=$?
last
exit "$rc"
