"""The check every `export_hf` test makes: the folder is the model, to transformers and to Aner.

`check_hf_export(model, folder)` exports `model` and asserts that transformers loads the folder
with no tensor missing, unexpected or of another shape (a misnamed tensor would be a freshly
initialised one there) and computes the model's logits on `TEXTS`, and that Aner's loader reads
it back with the same hyper-parameters and bit-equal weights (float32 export).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aner_lang.testing.hf_fixture import TEXTS


def check_hf_export(model: Any, folder: str | Path, tolerance: float = 1e-4) -> Any:
    """Export `model` to `folder` and check it as the module docstring says; returns the
    transformers model (eval mode, float32)."""
    import torch
    import transformers

    from aner_lang.runtime.export.hf import export_hf
    from aner_lang.runtime.load.loader import load_model

    out = export_hf(model, folder)
    loaded: Any = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, output_loading_info=True
    )
    hf, info = loaded
    wrong = {kind: keys for kind, keys in info.items() if keys}
    assert not wrong, f"transformers read {out} with {wrong}"
    for text in TEXTS:
        ids = torch.tensor([model.tokenizer.encode(text)])
        with torch.no_grad():
            theirs, ours = hf.eval()(ids).logits, model.forward(ids)
        torch.testing.assert_close(theirs, ours, atol=tolerance, rtol=tolerance)
    back = load_model(out, device="cpu")
    assert back.config == model.config
    ours_sd, back_sd = model.module.state_dict(), back.module.state_dict()
    assert ours_sd.keys() == back_sd.keys()
    for name, t in ours_sd.items():
        assert torch.equal(back_sd[name], t), name
    return hf
