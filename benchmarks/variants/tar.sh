#!/usr/bin/env bash
# .peers/NAME.tar: this checkout's HEAD with benchmarks/variants/NAME.patch applied, its aner_lang/,
# tests/ and benchmarks/ (what a device call unpacks over its copy of the tree, as scale_variant.sh does;
# the device machine needs no git for it).
#   benchmarks/variants/tar.sh kept_mlp
set -euo pipefail
name=$1 work=$(mktemp -d)
git archive HEAD aner_lang tests benchmarks | tar -x -C "$work"
(cd "$work" && git apply "$OLDPWD/benchmarks/variants/$name.patch")
mkdir -p .peers && tar -cf ".peers/$name.tar" -C "$work" aner_lang tests benchmarks
rm -rf "$work"
echo ".peers/$name.tar"
