"""A model family that is not Llama-shaped, carried as far as the code carries it today (docs/families.md,
"A family that is not Llama-shaped"): a fictitious `fusedln` with one packed q/k/v projection
(`self_attn.qkv_proj`), a packed gate/up projection and LayerNorm (weight and bias) where Llama has
RMSNorm. Its families-table entry takes it through the input check, the quantize shapes and memory
estimate, Quark's module <-> builder node names and the export's builder options; the generic fuse
chain then stops at its first norm, which is the step a real family of that shape must add (a matcher
of its own). test_new_family.py does the same for a Llama-shaped family, which needs nothing but the
entry. Nothing here runs Quark, the builder or onnxruntime: tiny shapes, one synthetic layer."""

from __future__ import annotations

import copy
import importlib.util
import re
from pathlib import Path

import pytest
from onnx import helper

from raipack.core.errors import UsageError
from raipack.npu import families
from raipack.npu.quark_config import hf_to_node, node_to_hf

NEW = "fusedln"  # a fictitious model_type
ARCH = "FusedLNForCausalLM"
HIDDEN, INTER, HEADS, KV, LAYERS, VOCAB = 64, 96, 4, 2, 2, 128
CONFIG = {"architectures": [ARCH], "model_type": NEW, "hidden_size": HIDDEN, "intermediate_size": INTER, "num_attention_heads": HEADS,
          "num_key_value_heads": KV, "num_hidden_layers": LAYERS, "vocab_size": VOCAB, "layer_norm_eps": 1e-5}
ENTRY = {"architecture": ARCH, "notes": "a test's family: packed qkv_proj and gate_up_proj, LayerNorm", "linears": "phi3",
         "export_options": {"windowed_kv_cache": "false"}}


@pytest.fixture
def with_family(monkeypatch):
    """The families table with the fictitious family added (what its entry in architectures.json does)."""
    def add(**changes):
        table = copy.deepcopy(families.families())
        table[NEW] = {**ENTRY, **changes}
        monkeypatch.setattr(families, "families", lambda: table)
        return table
    return add


# -- step 1: the input check ------------------------------------------------------------------------

def test_the_input_check_takes_the_family_from_its_entry(tmp_path, with_family):
    from raipack.builder.inputs import check_architecture

    with pytest.raises(UsageError, match=ARCH):
        check_architecture(tmp_path / "config.json", CONFIG)  # not in the table yet: refused, naming it
    with_family()
    check_architecture(tmp_path / "config.json", CONFIG)  # its entry is all the input check needs


# -- step 2: the quantize shapes and memory estimate -----------------------------------------------

def test_quantize_shapes_follow_the_packed_layout_the_entry_names(with_family):
    from raipack.stages.quantize.memory import Shape
    from raipack.stages.quantize.preflight import linear_shapes

    with_family()
    head = HIDDEN // HEADS
    layer = [("self_attn.qkv_proj", HIDDEN, (HEADS + 2 * KV) * head), ("self_attn.o_proj", HEADS * head, HIDDEN),
             ("mlp.gate_up_proj", HIDDEN, 2 * INTER), ("mlp.down_proj", INTER, HIDDEN)]
    want = [(f"model.layers.{i}.{n}", fi, fo) for i in range(LAYERS) for n, fi, fo in layer] + [("lm_head", HIDDEN, VOCAB)]
    assert linear_shapes(CONFIG) == want
    # the memory estimate counts the same linears (its names are the module names' last part)
    assert [(n.rsplit(".", 1)[-1], fi, fo) for n, fi, fo in want[:4]] == Shape.from_config(CONFIG).linears()


def test_a_linears_layout_the_code_does_not_know_has_no_shapes(with_family):
    """Linears named otherwise (GPT-NeoX's query_key_value, dense_h_to_4h) are a layout of their own:
    preflight has no shapes for it and falls back to building the model on the meta device, which
    needs transformers to know the model_type. The step: teach preflight.linear_shapes and memory.Shape the layout."""
    from raipack.stages.quantize.preflight import linear_shapes

    with_family(linears="neox")
    assert linear_shapes(CONFIG) is None


# -- step 4: Quark's names for the builder ---------------------------------------------------------

def test_quark_names_map_the_packed_projection_to_its_builder_node():
    assert hf_to_node("model.layers.1.self_attn.qkv_proj") == "/model/layers.1/attn/qkv_proj/MatMul"
    assert node_to_hf("/model/layers.1/attn/qkv_proj/MatMul") == [f"model.layers.1.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "qkv_proj")]
    assert node_to_hf("/model/layers.1/mlp/gate_up_proj/MatMul") == [f"model.layers.1.mlp.{p}" for p in ("gate_proj", "up_proj", "gate_up_proj")]
    # modules named in another scheme map to no builder node: Quark's exclusions would not reach the export
    assert hf_to_node("gpt_neox.layers.1.attention.query_key_value") is None


# -- step 5: the export's builder options, and the builder itself ---------------------------------

def test_export_takes_the_entry_s_builder_options(with_family):
    from raipack.stages.export.families import extra_options

    assert extra_options(NEW) == {}
    with_family()
    assert extra_options(NEW) == {"windowed_kv_cache": "false"}


def test_the_builder_dispatches_on_the_architecture_and_refuses_one_it_has_no_class_for():
    """onnxruntime-genai's create_model picks a class by config.architectures[0] and raises "The <name>
    model is not currently supported." for any other: a new architecture needs the builder's support
    (raipack patches only classes the builder has). Read from the installed builder's source, not imported."""
    package = importlib.util.find_spec("onnxruntime_genai")
    assert package is not None and package.submodule_search_locations
    source = (Path(package.submodule_search_locations[0]) / "models" / "builder.py").read_text("utf-8")
    known = set(re.findall(r'architectures\[0\] == "(\w+)"', source))
    assert {"LlamaForCausalLM", "Phi3ForCausalLM", "PhiForCausalLM"} <= known  # Phi(-2): a LayerNorm family the builder writes
    assert ARCH not in known and "model is not currently supported" in source


# -- step 6: the fuse matchers ----------------------------------------------------------------------

def _layer(norm: str, skip_norm: str):
    """One decoder layer as the builder writes it, without weights: norm -> packed Q/K/V MatMulNBits ->
    GroupQueryAttention -> o_proj -> skip norm -> gate/up, SiLU, down. `norm` and `skip_norm` name
    the norm ops (the RMS ones for Llama, LayerNormalization and SkipLayerNormalization for LayerNorm)."""
    def mm(name, x, out):
        return helper.make_node("MatMulNBits", [x, f"{name}.w", f"{name}.s"], [out], name=f"/model/layers.0/{name}/MatMul", domain="com.microsoft")

    norm_inputs = ["x", "ln.w"] + (["ln.b"] if norm == "LayerNormalization" else [])
    nodes = [
        helper.make_node(norm, norm_inputs, ["h"], name="/model/layers.0/input_layernorm/norm"),
        mm("attn/qkv_proj", "h", "qkv"),
        helper.make_node("GroupQueryAttention", ["qkv", "", "", "past_k", "past_v", "seqlens_k", "total", "cos", "sin"], ["a", "present_k", "present_v"],
                         name="/model/layers.0/attn/GroupQueryAttention", domain="com.microsoft", do_rotary=1, num_heads=HEADS, kv_num_heads=KV),
        mm("attn/o_proj", "a", "o"),
        helper.make_node(skip_norm, ["o", "x", "post.w"], ["p", "", "", "r"], name="/model/layers.0/post_attention_layernorm/norm", domain="com.microsoft"),
        mm("mlp/gate_proj", "p", "g"),
        mm("mlp/up_proj", "p", "u"),
        helper.make_node("Sigmoid", ["g"], ["s"], name="/model/layers.0/mlp/act/Sigmoid"),
        helper.make_node("Mul", ["g", "s"], ["act"], name="/model/layers.0/mlp/act/Mul"),
        helper.make_node("Mul", ["act", "u"], ["gu"], name="/model/layers.0/mlp/Mul"),
        mm("mlp/down_proj", "gu", "y"),
    ]
    return helper.make_graph(nodes, "layer", [], [])


def _match(graph):
    from raipack.stages.fuse.graph.model import Graph
    from raipack.stages.fuse.graph.patterns import match_layer

    g = Graph(graph)
    gqa = next(n for n in g.nodes if n.op_type == "GroupQueryAttention")
    groups, why = match_layer(g, gqa)
    return [op for op, _, _ in groups], why


def test_the_generic_fuse_chain_takes_the_packed_qkv_but_stops_at_a_layernorm(with_family):
    with_family()  # no fuse_matcher: the family matchers of the table (Gemma's) decline, the generic chain runs
    # with RMS norms the same layer, packed Q/K/V included, is four fused operators
    assert _match(_layer("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")) == (
        ["RMSNormQKV", "GQARope", "OProjSkipRMSNorm", "SiluGatedMLP"], "")
    # with LayerNorm it stops at the first link: the whole layer stays on the CPU (a fuse-pattern error in the fuse report)
    assert _match(_layer("LayerNormalization", "SkipLayerNormalization")) == ([], "the Q/K/V projections are not fed by an RMS norm")


def test_a_fuse_matcher_the_entry_names_must_exist(with_family):
    """The step for the fuse: a module stages/fuse/graph/<fuse_matcher>.py with match_layer(g, gqa), as gemma.py."""
    from raipack.stages.fuse.graph import patterns

    with_family(fuse_matcher=NEW)
    with pytest.raises(ModuleNotFoundError, match=f"raipack.stages.fuse.graph.{NEW}"):
        patterns.family_matchers()
