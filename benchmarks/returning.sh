#!/usr/bin/env bash
# Runs a command with OUT pointed at a scratch folder and packs that folder into one tar in the
# real $OUT every 15 s and at the end. A device call returns at most 8 files, and one cut short by
# its time limit returns only what is already under $OUT: this way it returns what was measured.
#   benchmarks/returning.sh NAME COMMAND [ARGS...]     ->  $OUT/NAME.tgz
set -u
name=$1; shift
real=${OUT:?OUT must be set}
scratch=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
pack() { tar -czf "$real/$name.tmp.tgz" -C "$scratch" . && mv "$real/$name.tmp.tgz" "$real/$name.tgz"; }
last() { pack; rm -rf "$scratch"; }
(while sleep "${PACK_EVERY_S:-15}"; do pack; done) &
packer=$!
# stopped (a `timeout` around this script): stop the command and the packer, pack once more
trap 'kill "$command" "$packer" 2>/dev/null; last; exit 143' TERM INT
OUT=$scratch "$@" &
command=$!
wait "$command"
rc=$?
kill "$packer" 2>/dev/null
last
exit "$rc"
