"""Mixture-of-experts architectures (Mixtral, Qwen3-MoE) from Hugging Face folders, against
transformers.

Each family's tiny random-weight model (4 experts, top 2; Qwen3-MoE with experts of their own
intermediate size, unnormalised top-k weights and one dense layer) is built with transformers and
saved as a folder. Aner's loss and logits equal transformers', tokenization equals the
`tokenizers` library's, the load-balancing loss equals transformers' `aux_loss`, a LoRA on every
expert's projections trains with the router unchanged, NF4 stores each expert as its own
`NF4Linear`, and the exports that cannot represent experts yet refuse clearly.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from aner_lang.problems.errors import AnerRuntimeError  # noqa: E402
from aner_lang.runtime import adapters  # noqa: E402
from aner_lang.runtime.adapters.files import save_adapter  # noqa: E402
from aner_lang.runtime.load.loader import load_model  # noqa: E402
from aner_lang.runtime.model.loss import IGNORE  # noqa: E402
from aner_lang.runtime.model.moe import MoeMLP  # noqa: E402
from aner_lang.testing.hf_fixture import MOE_FAMILIES, write_hf_model  # noqa: E402

TEXTS = [
    "The quiet mountain lake reflects the clear morning sky.",
    "Hello, world! 1234567 numbers: 3.14159 and 2,718",
    "DON'T won't I'll they've  double  spaces\n\nnew lines\ttabs",
    "Le café est très bon. 東京 🤗",
]
EXPERT_TARGETS = ["gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def family(request, tmp_path_factory):
    """(name, folder, transformers model) of one family."""
    folder = write_hf_model(tmp_path_factory.mktemp(request.param) / "hf", request.param, seed=7)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return request.param, folder, hf.eval()


def _ids(model, text=TEXTS[0]):
    return torch.tensor([model.tokenizer.encode(text)])


def _shifted(ids):
    return torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), IGNORE)], dim=1)


def test_loss_and_logits_equal_transformers(family):
    name, folder, hf = family
    ours = load_model(folder, device="cpu")
    assert ours.config.architecture == name
    sparse = [isinstance(layer.mlp, MoeMLP) for layer in ours.module.layers]
    assert sparse == ([True, False] if name == "qwen3_moe" else [True, True])
    for text in TEXTS:
        ids = _ids(ours, text)
        with torch.no_grad():
            want = hf(ids, labels=ids)
            loss = ours.loss(ids, _shifted(ids)) / (ids.shape[1] - 1)
            assert abs(loss.item() - want.loss.item()) <= 1e-3 * want.loss.item()
            assert (ours.forward(ids) - want.logits).abs().max().item() <= 1e-4
            assert float(want.logits.abs().max()) > 1.0


def test_routing_renormalises_as_the_family_does(family):
    """Mixtral renormalises the top-k weights; this Qwen3-MoE (norm_topk_prob false) does not."""
    name, folder, _ = family
    mlp = load_model(folder, device="cpu").module.layers[0].mlp
    x = torch.randn(16, mlp.gate.in_features, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        weights, chosen = mlp.route(x)
    sums = weights.sum(dim=-1)
    assert chosen.shape == (16, 2)
    if name == "mixtral":
        torch.testing.assert_close(sums, torch.ones(16))
    else:
        assert (sums < 1 - 1e-3).all()


def test_tokenization_equals_the_tokenizers_library(family):
    from tokenizers import Tokenizer

    _, folder, _ = family
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok = load_model(folder, device="cpu").tokenizer
    for text in TEXTS:
        assert tok.encode(text) == reference.encode(text, add_special_tokens=True).ids


def test_load_balancing_loss_equals_transformers_aux_loss(family, tmp_path):
    """With ``output_router_logits`` the training loss is mean CE + coef * aux, as transformers
    computes it; evaluation (router_aux off) stays the plain loss."""
    _, folder, hf = family
    config = json.loads((folder / "config.json").read_text())
    config.update(output_router_logits=True, router_aux_loss_coef=0.25)
    copy = tmp_path / "aux"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    (copy / "config.json").write_text(json.dumps(config))
    ours = load_model(copy, device="cpu")
    assert ours.config.router_aux_loss_coef == 0.25
    ids = torch.tensor([ours.tokenizer.encode(t)[:12] for t in TEXTS])
    with torch.no_grad():
        want = hf(ids, labels=ids, output_router_logits=True)
        scored = ids.shape[0] * (ids.shape[1] - 1)
        plain = ours.module.loss(ids, _shifted(ids)) / scored
        total = ours.module.loss(ids, _shifted(ids), router_aux=True) / scored
    assert float(want.aux_loss) > 2.0  # top-2 of 4: 2 at balance, more when unbalanced
    torch.testing.assert_close(total - plain, 0.25 * want.aux_loss, atol=1e-5, rtol=1e-4)


def test_lora_on_every_expert_trains_with_the_router_unchanged(family, trained_like):
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    _, folder, _ = family
    model = load_model(folder, device="cpu")
    router = model.module.layers[0].mlp.gate.dense_weight()
    adapter = adapters.lora(model, rank=4, alpha=8.0, targets=["q_proj", *EXPERT_TARGETS])
    names = [name for name, _ in adapter.targets]
    assert "layers.0.mlp.experts.3.down_proj" in names
    assert not any(n.endswith("mlp.gate") for n in names)
    assert adapter.params["layers.0.mlp.experts.1.up_proj.lora_A"].shape == (4, 64)
    run = train(adapter, from_texts(TEXTS, context=32), profile(), steps=5, learning_rate=1e-2)
    assert run.loss_history[-1] < run.loss_history[0]
    assert torch.equal(model.module.layers[0].mlp.gate.dense_weight(), router)
    moved = [
        n
        for n, p in adapter.params.items()
        if ".experts." in n and n.endswith("lora_B") and p.any()
    ]
    assert len(moved) >= 2  # routed experts trained their own B, separately
    trained_like(adapter)
    ids = _ids(model)
    with torch.no_grad():
        assert (adapter.forward(ids) - model.forward(ids)).abs().max() > 1e-3


def test_expert_lora_export_to_peft_is_refused_clearly(family, tmp_path):
    _, folder, _ = family
    model = load_model(folder, device="cpu")
    adapter = adapters.lora(model, rank=2, targets=["up_proj"])
    with pytest.raises(AnerRuntimeError, match="mixture-of-experts") as e:
        save_adapter(adapter, tmp_path / "peft", format="peft")
    assert e.value.code == "E-EXPORT"
    assert not (tmp_path / "peft").exists()
    save_adapter(adapter, tmp_path / "aner", format="safetensors")  # Aner's own form works


def test_attention_lora_exports_to_peft_and_loads_in_transformers(family, tmp_path, trained_like):
    peft = pytest.importorskip("peft")
    _, folder, _ = family
    model = load_model(folder, device="cpu")
    adapter = trained_like(adapters.lora(model, rank=2, targets=["q_proj", "v_proj"], seed=3))
    out = save_adapter(adapter, tmp_path / "peft", format="peft")
    theirs = peft.AutoPeftModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    ids = _ids(model, TEXTS[1])
    with torch.no_grad():
        torch.testing.assert_close(theirs(ids).logits, adapter.forward(ids), atol=1e-4, rtol=1e-4)


def test_model_file_exports_refuse_experts(family, tmp_path):
    from aner_lang.runtime.export.gguf import export_gguf
    from aner_lang.runtime.export.hf import export_hf

    _, folder, _ = family
    model = load_model(folder, device="cpu")
    for write in (export_gguf, export_hf):
        with pytest.raises(AnerRuntimeError, match="mixture of experts") as e:
            write(model, tmp_path / "out")
        assert e.value.code == "E-EXPORT"
        assert not (tmp_path / "out").exists()


def test_nf4_stores_each_expert_as_its_own_nf4_linear(family):
    from aner_lang.runtime.nf4.linear import NF4Linear
    from aner_lang.runtime.nf4.quant import quantize_nf4

    _, folder, _ = family
    dense = load_model(folder, device="cpu")
    nf4 = load_model(folder, storage="nf4_double_quant", device="cpu")
    mlp = nf4.module.layers[0].mlp
    assert all(isinstance(e.down_proj, NF4Linear) for e in mlp.experts)
    got = mlp.experts[2].gate_proj.weight_nf4
    want = quantize_nf4(dense.module.layers[0].mlp.experts[2].gate_proj.dense_weight())
    assert torch.equal(got.packed, want.packed)
    ids = _ids(dense)
    with torch.no_grad():
        assert (nf4.forward(ids) - dense.forward(ids)).abs().max().item() < 2.0
