# Sourced by the device scripts before they run a benchmark: this tree, its LSP server and its
# benchmarks on the path, then gpu_suite.sh's wheels (/tmp/site) or the carried peers' site
# (.peers/site, which serves instead of .whl), and the kernels' persistent cache.
peers=""; [[ -d .peers/site ]] && peers=":$PWD/.peers/site"
export PYTHONPATH="$PWD:$PWD/lsp:$PWD/benchmarks:/tmp/site$peers${PYTHONPATH:+:$PYTHONPATH}"
export ANER_KERNEL_CACHE=/tmp/aner-kernels
