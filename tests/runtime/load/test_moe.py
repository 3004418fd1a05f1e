"""Mixture-of-experts architectures (Mixtral, Qwen3-MoE) from Hugging Face folders and GGUF
files, against transformers and llama.cpp.

Each family's tiny random-weight model (4 experts, top 2; Qwen3-MoE with experts of their own
intermediate size, unnormalised top-k weights and one dense layer) is built with transformers and
saved as a folder. Aner's loss and logits equal transformers', the load-balancing loss equals
transformers' `aux_loss`, a LoRA on every expert's projections trains with the router unchanged and,
merged, exports to a Hugging Face folder in the Hub's layout that transformers and Aner read as it
computes; saved as PEFT, PEFT's `target_parameters` LoRA, it loads in transformers + PEFT with
Aner's logits and back in Aner (PEFT's own such adapters too); NF4 stores each expert as its own
`NF4Linear`. The GGUF side uses the configuration llama.cpp's graph assumes (`LLAMACPP_MOE`: every
layer sparse, weights renormalised): Aner's export loads back with transformers' logits and loss,
every reader of the 3-D expert tensors agrees, llama.cpp reads the export with Aner's
log-probabilities, and what stays refused is refused clearly.
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
from aner_lang.runtime.model.moe import MoeMLP, collecting_router_logits  # noqa: E402
from aner_lang.testing.hf_export import check_hf_export  # noqa: E402
from aner_lang.testing.hf_fixture import (  # noqa: E402
    LLAMACPP_MOE,
    MOE_FAMILIES,
    TEXTS,
    write_hf_model,
)

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


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_a_config_without_top_k_routes_as_transformers_defaults(name, tmp_path):
    """A config.json that leaves `num_experts_per_tok` out gets transformers' default for its
    family (Mixtral top 2, Qwen3-MoE top 8), read from the architecture table."""
    folder = write_hf_model(tmp_path / "hf", name, seed=7, config={"num_experts": 8}
                            if name == "qwen3_moe" else {"num_local_experts": 8})  # fmt: skip
    path = folder / "config.json"
    config = json.loads(path.read_text())
    del config["num_experts_per_tok"]
    path.write_text(json.dumps(config))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    ours = load_model(folder, device="cpu")
    assert (
        ours.config.num_experts_per_tok
        == hf.config.num_experts_per_tok
        == (8 if name == "qwen3_moe" else 2)
    )
    ids = _ids(ours)
    with torch.no_grad():
        assert (ours.forward(ids) - hf.eval()(ids).logits).abs().max().item() <= 1e-4


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
    check_hf_export(ours, tmp_path / "out")  # the weight and output_router_logits travel


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


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def sparse(request, tmp_path_factory):
    """(name, folder, transformers model) of one family with every layer sparse (the Qwen3-MoE
    fixture keeps its unnormalised routing, loses its dense layer)."""
    config = {"mlp_only_layers": []} if request.param == "qwen3_moe" else None
    root = tmp_path_factory.mktemp(f"{request.param}_sparse")
    folder = write_hf_model(root / "hf", request.param, seed=7, config=config)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return request.param, folder, hf.eval()


@pytest.mark.parametrize(
    ("targets", "rank", "alpha"),
    [
        (["down_proj"], 2, 5.0),
        (["up_proj"], 2, 4.0),
        (["q_proj", "gate_proj", "up_proj"], 4, 8.0),
        (["v_proj", *EXPERT_TARGETS], 3, 2.0),
    ],
)
def test_expert_lora_exports_to_peft_with_our_logits(sparse, tmp_path, targets, rank, alpha):
    """A LoRA on experts (and attention), trained a few steps: PEFT loads the export onto
    transformers' model (experts as `target_parameters`, gate and up fused) with Aner's logits,
    and Aner reads it back with the same tensors."""
    import copy

    from safetensors.torch import load_file

    from aner_lang.runtime.adapters.files import load_adapter
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    peft = pytest.importorskip("peft")
    _, folder, hf = sparse
    model = load_model(folder, device="cpu")
    adapter = adapters.lora(model, rank=rank, alpha=alpha, targets=targets, seed=1)
    train(adapter, from_texts(TEXTS, context=32), profile(), steps=3, learning_rate=2e-2)
    out = save_adapter(adapter, tmp_path / "peft", format="peft")
    config = json.loads((out / "adapter_config.json").read_text())
    fused = {"gate_proj", "up_proj"} <= set(targets)
    assert set(config["target_parameters"]) == {
        "experts.down_proj" if t == "down_proj" else "experts.gate_up_proj"
        for t in targets
        if t in EXPERT_TARGETS
    }
    assert config["rank_pattern"] == ({"experts.gate_up_proj": 2 * rank} if fused else {})
    stacked = load_file(str(out / "adapter_model.safetensors"))
    experts = model.config.num_experts
    assert any(t.shape[0] == rank * experts * (2 if fused else 1) for t in stacked.values())
    theirs = peft.PeftModel.from_pretrained(copy.deepcopy(hf), str(out)).eval()
    back = load_adapter(model, out)
    for name, t in adapter.tensors().items():
        assert torch.equal(back.tensors()[name], t), name
    for text in TEXTS[:2]:
        ids = _ids(model, text)
        with torch.no_grad():
            ours = adapter.forward(ids)
            assert (ours - model.forward(ids)).abs().max() > 1e-2
            torch.testing.assert_close(theirs(ids).logits, ours, atol=1e-4, rtol=1e-4)


def test_peft_expert_lora_loads_in_aner_with_peft_logits(sparse, tmp_path):
    """A LoRA PEFT itself makes on the experts' 3-D parameters (one rank for gate and up
    together: Aner's gate and up share its A) and saves loads in Aner with PEFT's logits."""
    import copy

    from aner_lang.runtime.adapters.files import load_adapter

    peft = pytest.importorskip("peft")
    _, folder, hf = sparse
    config = peft.LoraConfig(
        r=2,
        lora_alpha=6,
        target_modules=["k_proj"],
        target_parameters=["experts.gate_up_proj", "experts.down_proj"],
    )
    theirs = peft.get_peft_model(copy.deepcopy(hf), config)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    theirs.save_pretrained(str(tmp_path / "peft"))
    model = load_model(folder, device="cpu")
    ours = load_adapter(model, tmp_path / "peft")
    assert {t.rsplit(".", 1)[1] for t, _ in ours.targets} == {"k_proj", *EXPERT_TARGETS}
    ids = _ids(model, TEXTS[2])
    with torch.no_grad():
        want = theirs.eval()(ids).logits
        assert (want - hf(ids).logits).abs().max() > 1e-2
        torch.testing.assert_close(ours.forward(ids), want, atol=1e-4, rtol=1e-4)


def _refused_for_peft(adapter, folder, why) -> None:
    """`adapter` has no PEFT form for the reason `why`: E-EXPORT, nothing written, and Aner's
    own format keeps it."""
    with pytest.raises(AnerRuntimeError, match=f"mixture-of-experts experts .* with {why}") as e:
        save_adapter(adapter, folder / "peft", format="peft")
    assert e.value.code == "E-EXPORT"
    assert "format: safetensors" in " ".join(e.value.notes)
    assert not (folder / "peft").exists()
    save_adapter(adapter, folder / "aner", format="safetensors")


def test_expert_lora_with_dropout_or_dora_is_refused_for_peft_clearly(sparse, tmp_path):
    """PEFT's LoRA of expert parameters has neither dropout nor DoRA."""
    model = load_model(sparse[1], device="cpu")
    dropout = adapters.lora(model, rank=2, dropout=0.1, targets=["down_proj"])
    _refused_for_peft(dropout, tmp_path / "dropout", "LoRA dropout")
    dora = adapters.dora(model, rank=2, targets=["q_proj", "up_proj"])
    _refused_for_peft(dora, tmp_path / "dora", "DoRA")
    attention = adapters.lora(model, rank=2, dropout=0.1, targets=["q_proj"])
    save_adapter(attention, tmp_path / "attention", format="peft")  # not on experts: written


@pytest.mark.parametrize("family", ["qwen3_moe"], indirect=True)
def test_experts_beside_an_adapted_dense_mlp_are_refused_for_peft_clearly(family, tmp_path):
    """PEFT reads a Qwen3-MoE's target_modules gate_proj/up_proj/down_proj as its experts, so
    the fixture's dense layer 1 would lose its LoRA."""
    model = load_model(family[1], device="cpu")
    adapter = adapters.lora(model, rank=2, targets=["gate_proj"])
    _refused_for_peft(adapter, tmp_path, "the dense MLP of layers 1 adapted too")


def test_peft_expert_lora_that_is_not_ours_is_refused_clearly(sparse, tmp_path, trained_like):
    """A rank-2r gate_up_proj LoRA whose B is not block-diagonal is not a gate and an up LoRA,
    a rank or alpha pattern that changes a target's rank or scaling is not Aner's one-rank LoRA,
    and a pattern key that is more than names and `.*` or a target parameter that is not an
    expert's are not read: each is refused naming the folder, never loaded as something else."""
    from safetensors.torch import load_file, save_file

    from aner_lang.runtime.adapters.files import load_adapter

    _, folder, _ = sparse
    model = load_model(folder, device="cpu")
    adapter = trained_like(adapters.lora(model, rank=2, targets=["gate_proj", "up_proj"]))
    out = save_adapter(adapter, tmp_path / "peft", format="peft")
    weights = out / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    key = "base_model.model.model.layers.0.mlp.experts.lora_B.weight"
    tensors[key][0, -1] = 1.0  # expert 3's second up column, on a gate row
    save_file(tensors, str(weights))
    with pytest.raises(AnerRuntimeError, match="not block-diagonal") as e:
        load_adapter(model, out)
    assert e.value.code == "E-ADAPTER-PEFT" and "adapter_model.safetensors" in e.value.message
    config = json.loads((out / "adapter_config.json").read_text())
    for edit, message in [
        ({"alpha_pattern": {"experts.gate_up_proj": 3.0}}, "one rank and scaling"),
        ({"rank_pattern": {"experts.gate_up_proj": 6}}, "one rank and scaling"),
        ({"target_modules": ["q_proj"], "alpha_pattern": {"q_proj": 1}}, "one rank and scaling"),
        ({"rank_pattern": {"(a+)+$": 4}}, "rank_pattern is not an object of plain names"),
        ({"alpha_pattern": {"x": "4"}}, "alpha_pattern is not an object of plain names"),
        ({"target_parameters": ["experts.w9"]}, r"target parameters \['experts.w9'\]"),
        ({"target_parameters": "experts.down_proj"}, "target_parameters is not a list"),
    ]:
        (out / "adapter_config.json").write_text(json.dumps({**config, **edit}))
        with pytest.raises(AnerRuntimeError, match=message) as e:
            load_adapter(model, out)
        assert e.value.code == "E-ADAPTER-PEFT" and str(out) in e.value.message


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


def test_merged_expert_lora_exports_to_hf_in_the_hubs_layout(family, tmp_path):
    """A LoRA on attention and every expert's projections, trained a few steps and merged: the
    export_hf folder holds the tensors transformers itself saves for the family (per-expert
    matrices and router under the family's names) and its config fields, and is the merged model
    to transformers (logits) and to Aner (weights bit-equal, `check_hf_export`)."""
    from safetensors import safe_open

    from aner_lang.runtime.adapters.merge import merge
    from aner_lang.runtime.tasks.data import from_texts
    from aner_lang.runtime.train.profile import profile
    from aner_lang.runtime.train.trainer import train

    _, folder, hf = family
    model = load_model(folder, device="cpu")
    adapter = adapters.lora(model, rank=4, alpha=8.0, targets=["q_proj", *EXPERT_TARGETS], seed=2)
    train(adapter, from_texts(TEXTS, context=32), profile(), steps=3, learning_rate=1e-2)
    merged = merge(adapter)
    expert = "layers.0.mlp.experts.{}.down_proj"
    moved = [
        e
        for e in range(model.config.num_experts)
        if not torch.equal(
            merged.module.get_submodule(expert.format(e)).dense_weight(),
            model.module.get_submodule(expert.format(e)).dense_weight(),
        )
    ]
    assert moved  # the export carries trained experts
    theirs = check_hf_export(merged, tmp_path / "merged")
    names = []
    for path in (folder, tmp_path / "merged"):
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            names.append(sorted(f.keys()))
    assert names[0] == names[1]
    for key in (
        "num_local_experts",
        "num_experts_per_tok",
        "intermediate_size",
        "moe_intermediate_size",
        "norm_topk_prob",
        "mlp_only_layers",
        "decoder_sparse_step",
        "output_router_logits",
    ):
        assert getattr(theirs.config, key, None) == getattr(hf.config, key, None), key


def test_gguf_export_refuses_what_llama_cpp_reads_differently(tmp_path):
    """export_gguf refuses the Qwen3-MoE fixture's dense layer and unnormalised routing
    (llama.cpp's graph has neither), naming both; nothing is written."""
    from aner_lang.runtime.export.gguf import export_gguf

    model = load_model(write_hf_model(tmp_path / "hf", "qwen3_moe", seed=7), device="cpu")
    with pytest.raises(AnerRuntimeError, match=r"dense MLP layers \[1\] and top-k") as e:
        export_gguf(model, tmp_path / "out.gguf")
    assert e.value.code == "E-EXPORT"
    assert not (tmp_path / "out.gguf").exists()


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


@pytest.fixture(scope="module", params=MOE_FAMILIES)
def exported(request, tmp_path_factory):
    """(folder model, its f32 GGUF export, transformers model) of one family as llama.cpp's graph
    has it (`LLAMACPP_MOE` for Qwen3-MoE)."""
    from aner_lang.runtime.export.gguf import export_gguf

    root = tmp_path_factory.mktemp(f"{request.param}_gguf")
    config = LLAMACPP_MOE if request.param == "qwen3_moe" else None
    folder = write_hf_model(root / "hf", request.param, seed=11, config=config)
    model = load_model(folder, device="cpu")
    gguf = export_gguf(model, root / "model.gguf", dtype="f32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return model, gguf, hf.eval()


def test_gguf_export_loads_back_with_transformers_logits_and_loss(exported):
    import gguf as gguf_lib

    model, path, hf = exported
    back = load_model(path, device="cpu")
    assert back.config.architecture == model.config.architecture
    for field in ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob"):
        assert getattr(back.config, field) == getattr(model.config, field)
    assert all(isinstance(layer.mlp, MoeMLP) for layer in back.module.layers)
    reader = gguf_lib.GGUFReader(str(path))
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors}
    c = model.config
    gate = gguf_lib.TENSOR_NAMES[gguf_lib.MODEL_TENSOR.FFN_GATE_EXP].format(bid=1) + ".weight"
    assert shapes[gate] == (c.hidden_size, c.moe_intermediate_size, c.num_experts)  # ggml order
    for text in TEXTS:
        ids = _ids(back, text)
        assert ids.tolist() == _ids(model, text).tolist()
        with torch.no_grad():
            want = hf(ids, labels=ids)
            loss = back.loss(ids, _shifted(ids)) / (ids.shape[1] - 1)
            assert abs(loss.item() - want.loss.item()) <= 1e-3 * want.loss.item()
            assert (back.forward(ids) - want.logits).abs().max().item() <= 1e-4


@pytest.mark.parametrize("dtype", ["q8_0", "q4_k_m"])
def test_quantized_expert_tensors_read_the_same_by_every_reader(exported, tmp_path, dtype):
    """A quantized export's expert slices: dequantized (float32), kept as blocks (storage: gguf)
    and NF4 of the dequantized values agree exactly; the router stays f32 as llama.cpp keeps it."""
    from aner_lang.runtime.export.gguf import export_gguf
    from aner_lang.runtime.io.gguf import GGUFFile
    from aner_lang.runtime.nf4.quant import quantize_nf4

    model = exported[0]
    path = export_gguf(model, tmp_path / f"{dtype}.gguf", dtype=dtype)
    file = GGUFFile(path)
    assert file.tensor_type("blk.0.ffn_gate_inp.weight") == "F32"
    assert file.tensor_type("blk.0.ffn_up_exps.weight") != "F32"
    dense = load_model(path, device="cpu")
    blocks = load_model(path, storage="gguf", device="cpu")
    nf4 = load_model(path, storage="nf4_double_quant", device="cpu")
    for e in range(model.config.num_experts):
        for p in ("gate_proj", "up_proj", "down_proj"):
            want = dense.module.layers[1].mlp.experts[e].get_submodule(p).dense_weight()
            got = blocks.module.layers[1].mlp.experts[e].get_submodule(p).dense_weight()
            assert torch.equal(got, want), (e, p)
    stored = nf4.module.layers[1].mlp.experts[3].down_proj.weight_nf4
    want_nf4 = quantize_nf4(dense.module.layers[1].mlp.experts[3].down_proj.dense_weight())
    assert torch.equal(stored.packed, want_nf4.packed)
    ids = _ids(model)
    with torch.no_grad():
        torch.testing.assert_close(blocks.forward(ids), dense.forward(ids), atol=1e-4, rtol=1e-4)
        assert (dense.forward(ids) - model.forward(ids)).abs().max().item() < 2.0


@pytest.mark.parametrize("exported", ["mixtral"], indirect=True)
def test_bad_expert_metadata_is_refused_with_the_file_and_key(exported, tmp_path):
    """A zero top-k, an expert count the tensors do not have, and experts declared under a dense
    architecture: each a clear error naming the file (rewrite_gguf copies Mixtral's keys)."""
    import gguf as gguf_lib

    from aner_lang.testing.fixture import rewrite_gguf

    _, path, _ = exported
    u32 = gguf_lib.GGUFValueType.UINT32
    used = rewrite_gguf(
        path, tmp_path / "used.gguf", metadata={"llama.expert_used_count": (0, u32)}
    )
    with pytest.raises(AnerRuntimeError, match=r"llama\.expert_used_count is 0") as e:
        load_model(used, device="cpu")
    assert e.value.code == "E-GGUF-METADATA" and str(used) in e.value.message
    count = rewrite_gguf(path, tmp_path / "count.gguf", metadata={"llama.expert_count": (3, u32)})
    with pytest.raises(AnerRuntimeError, match=r"blk\.0\.ffn_gate_inp\.weight") as e:
        load_model(count, device="cpu")
    assert e.value.code == "E-GGUF-SHAPE"
    dense = rewrite_gguf(
        path,
        tmp_path / "qwen3.gguf",
        metadata={"qwen3.expert_count": (4, u32)},
        architecture="qwen3",
    )
    with pytest.raises(AnerRuntimeError, match="a qwen3 GGUF with 4 experts") as e:
        load_model(dense, device="cpu")
    assert e.value.code == "E-GGUF-ARCH" and str(dense) in e.value.message


def test_a_lora_on_experts_exports_each_projections_experts_stacked(
    exported, tmp_path, trained_like
):
    """Attention targets export as on a dense model; each expert's change is factored alone and
    one projection's experts stacked in expert order, `lora_a` [experts, rank, in] and `lora_b`
    [experts, out, rank], whose products are each expert's change."""
    from aner_lang.runtime.adapters.merge import effective_weights
    from aner_lang.runtime.export.lora_gguf import export_lora_gguf
    from aner_lang.runtime.io.gguf import GGUFFile

    model = load_model(exported[1], device="cpu")
    c = model.config
    adapter = trained_like(adapters.lora(model, rank=2, targets=["q_proj", "down_proj"], seed=4))
    out = GGUFFile(export_lora_gguf(adapter, tmp_path / "lora.gguf"))
    assert "blk.1.attn_q.weight.lora_a" in out.tensors
    assert "blk.0.ffn_down.weight.lora_a" not in out.tensors  # the experts' tensor is 3-D
    a = out.tensor("blk.0.ffn_down_exps.weight.lora_a", (c.num_experts, 2, _expert_width(c)))
    b = out.tensor("blk.0.ffn_down_exps.weight.lora_b", (c.num_experts, c.hidden_size, 2))
    changed = effective_weights(adapter)
    for e in range(c.num_experts):
        name = f"layers.0.mlp.experts.{e}.down_proj"
        module = model.module.get_submodule(name)
        delta = changed[name] - module.dense_weight()
        assert float(delta.abs().max()) > 1e-4
        torch.testing.assert_close(b[e] @ a[e], delta, atol=1e-5, rtol=1e-4)


def _expert_width(c) -> int:  # type: ignore[no-untyped-def]
    return c.moe_intermediate_size or c.intermediate_size


@pytest.mark.slow
def test_llama_cpp_reads_the_exported_gguf_with_our_probabilities(exported):
    """llama.cpp (xllamacpp's server) on the f32 GGUF Aner wrote: the same next-token
    log-probabilities as Aner's (which are transformers', above) for prompts of several lengths,
    within llama.cpp's CPU rounding (3e-3, as for the dense families)."""
    pytest.importorskip("xllamacpp")
    model = load_model(exported[1], device="cpu")
    _agrees_with_llama_cpp(exported[1], model.forward, model.config)


@pytest.mark.slow
def test_llama_cpp_applies_the_attention_lora_gguf_as_aner_does(exported, tmp_path, trained_like):
    pytest.importorskip("xllamacpp")
    from aner_lang.runtime.export.lora_gguf import export_lora_gguf

    model = load_model(exported[1], device="cpu")
    adapter = trained_like(adapters.lora(model, rank=2, targets=["q_proj", "o_proj"], seed=5))
    lora = export_lora_gguf(adapter, tmp_path / "attn.gguf")
    ids = _ids(model)
    with torch.no_grad():
        assert (adapter.forward(ids) - model.forward(ids)).abs().max() > 1e-2
    _agrees_with_llama_cpp(exported[1], adapter.forward, model.config, loras=[lora])


@pytest.mark.slow
def test_llama_cpp_applies_a_lora_on_the_experts_as_aner_does(exported, tmp_path, trained_like):
    pytest.importorskip("xllamacpp")
    from aner_lang.runtime.export.lora_gguf import export_lora_gguf

    model = load_model(exported[1], device="cpu")
    targets = ["gate_proj", "up_proj", "down_proj"]
    adapter = trained_like(adapters.lora(model, rank=2, targets=targets, seed=6))
    lora = export_lora_gguf(adapter, tmp_path / "experts.gguf")
    ids = _ids(model)
    with torch.no_grad():
        assert (adapter.forward(ids) - model.forward(ids)).abs().max() > 1e-2
    _agrees_with_llama_cpp(exported[1], adapter.forward, model.config, loras=[lora])


def _agrees_with_llama_cpp(path, forward, config, loras=()) -> None:
    """llama.cpp's top-5 next-token log-probabilities equal `forward`'s within 3e-3 on random
    prompts. A prompt where some token's k-th and (k+1)-th router probabilities are within 1e-3
    is skipped: there llama.cpp's rounding may pick the other expert (measured: margins near
    1e-4 moved a log-probability by 0.04-0.07)."""
    from aner_lang.testing.llamacpp import llama_server, next_token_logprobs

    gen = torch.Generator().manual_seed(0)
    compared = 0
    with llama_server(path, context=256, loras=loras) as url:
        for n in (5, 7, 9, 12, 17, 24, 6, 10, 14):
            ids = torch.randint(10, config.vocab_size - 10, (n,), generator=gen).tolist()
            with torch.no_grad(), collecting_router_logits() as logits:
                ours = forward(torch.tensor([ids]))[0, -1].log_softmax(-1)
            theirs = next_token_logprobs(url, ids)
            if theirs is None or _routing_margin(logits, config.num_experts_per_tok) < 1e-3:
                continue
            compared += 1
            for token, logprob in theirs.items():
                assert abs(float(ours[token]) - logprob) < 3e-3, (ids, token, logprob)
            assert max(theirs, key=lambda t: theirs[t]) == int(ours.argmax())
    assert compared >= 3


def _routing_margin(logits: list[torch.Tensor], k: int) -> float:
    """The smallest gap between a token's k-th and (k+1)-th router probability, in any layer."""
    top = torch.cat(logits).float().softmax(-1).topk(k + 1, dim=-1).values
    return float((top[:, k - 1] - top[:, k]).min())


@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_the_tables_gguf_names_are_llama_cpps_for_the_architecture(name):
    """Every GGUF tensor name the table gives (router and 3-D expert tensors included) is one the
    gguf package lists for the architecture (the table cannot import gguf: the front end reads
    it), and so is every expert metadata key Aner writes."""
    import gguf as gguf_lib

    from aner_lang.architectures import ARCHITECTURES
    from aner_lang.runtime.model.config import ModelConfig, gguf_hyperparameters

    table = ARCHITECTURES[name]
    arch = {"mixtral": gguf_lib.MODEL_ARCH.LLAMA, "qwen3_moe": gguf_lib.MODEL_ARCH.QWEN3MOE}[name]
    assert gguf_lib.MODEL_ARCH_NAMES[arch] == table.gguf_architectures[0]
    known = set()
    for t in gguf_lib.MODEL_TENSORS[arch]:
        known |= {gguf_lib.TENSOR_NAMES[t].format(bid=i) + ".weight" for i in range(2)}
    config = ModelConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        architecture=name,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
    )
    names = {w.gguf for w in table.weights(2, False, config.experts_in)}
    assert {"blk.1.ffn_gate_inp.weight", "blk.1.ffn_down_exps.weight"} <= names
    assert names <= known | {table.embedding, table.output, table.output_norm}
    keys = set(gguf_hyperparameters(config))
    for key in ("EXPERT_COUNT", "EXPERT_USED_COUNT", "EXPERT_FEED_FORWARD_LENGTH"):
        assert getattr(gguf_lib.Keys.LLM, key).format(arch=table.gguf_architectures[0]) in keys
