"""benchmarks/offload_copies.py on the CPU (the plumbing alone): every update reported, and what
`offload` packed and kept counted by kind."""

from __future__ import annotations

import json
import re

from aner_lang.runtime.model import host_copies
from aner_lang.runtime.train import trainer


def test_each_update_and_each_kind_of_copy_is_counted(tiny_bytes_gguf, tmp_path, bench_script):
    copies = bench_script("offload_copies")
    out = tmp_path / "copies.json"
    args = ["--model", str(tiny_bytes_gguf), "--context", "32", "--updates", "2"]
    assert copies.main([*args, "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["updates"]) == 2
    # the losses and gradient norms the run logged, to compare codes with
    assert len(result["losses"]) == 2 and all(
        loss > 0 and norm > 0 for loss, norm in result["losses"]
    )
    assert all(u["seconds"] > 0 and u["host_seconds"]["pack"] > 0 for u in result["updates"])
    config = copies.load_model(tiny_bytes_gguf, storage="nf4_double_quant", device="cpu").config
    # every layer's input, once per micro-batch of every update
    inputs = rf"pack \((\d+), (\d+), {config.hidden_size}\) "
    found = [(re.match(inputs, kind), n) for kind, n in result["copies"].items()]
    packed = [(int(m[1]) * int(m[2]), n) for m, n in found if m]
    assert sum(n for _, n in packed) >= 2 * config.num_hidden_layers
    # the tokens of each update, as logged: what each packed layer input held (one micro-batch)
    assert len(result["tokens"]) == 2 and set(result["tokens"]) == {t for t, _ in packed}
    # attention's output and log-sum-exp, kept beside the layer inputs
    assert any(kind.startswith("keep ") for kind in result["copies"])
    # the patches are gone once it returns
    assert host_copies.HostCopies.pack.__name__ == "pack"
    assert trainer._Loop.update.__name__ == "update"
