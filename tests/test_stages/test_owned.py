"""stages/quantize/owned.py: the loaded weights leave the mapped safetensors before Quark writes into them."""

from __future__ import annotations

import pytest

from raipack.stages.quantize.owned import file_mappings, own_mapped_tensors


def _mapped(model) -> list[str]:
    maps = file_mappings()
    return [name for name, p in model.named_parameters(remove_duplicate=False)
            if any(m.start <= p.data_ptr() < m.end for m in maps)]


@pytest.fixture()
def bf16_model(tiny_llama, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    src = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.bfloat16).save_pretrained(src)
    return src


def test_loaded_views_of_the_file_get_memory_of_their_own(bf16_model):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(bf16_model), dtype=torch.bfloat16)
    # the premise: transformers hands out views of the mapped file when the dtype is the file's
    before = _mapped(model)
    assert len(before) >= 10, "transformers no longer maps the safetensors: owned.py has nothing to do"
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    moved = own_mapped_tensors(model)
    assert moved["tensors"] == len({id(p) for _, p in model.named_parameters()})  # every unique parameter was a view
    assert moved["bytes"] == sum(p.numel() * p.element_size() for p in model.parameters())
    assert _mapped(model) == []
    file = load_file(str(bf16_model / "model.safetensors"))
    for name, p in model.named_parameters():
        if name in file:
            assert torch.equal(p.data, file[name]), name
    # tied weights stay one tensor
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    assert own_mapped_tensors(model) == {"tensors": 0, "bytes": 0, "kept_mapped_bytes": 0}  # nothing left to move


def test_tensors_to_keep_stay_views_of_the_file(bf16_model):
    """The token embedding (which Quark never writes) stays a view: its pages are read only where used."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(bf16_model), dtype=torch.bfloat16)
    embed = model.get_input_embeddings().weight
    moved = own_mapped_tensors(model, keep=[embed, None])
    assert moved["kept_mapped_bytes"] == embed.numel() * embed.element_size() > 0
    assert moved["tensors"] == len({id(p) for p in model.parameters()}) - 1
    names = {name for name, p in model.named_parameters(remove_duplicate=False) if p is embed}
    assert set(_mapped(model)) == names  # the embedding (and a head tied to it) alone


def test_a_model_built_in_memory_has_nothing_to_move():
    import torch

    assert own_mapped_tensors(torch.nn.Linear(8, 4)) == {"tensors": 0, "bytes": 0, "kept_mapped_bytes": 0}


def test_file_mappings_reads_the_maps_file(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f0000000000-7f0000100000 r--p 00001000 08:01 42 /data/model-00001.safetensors\n"
                    "7f0000100000-7f0000200000 r-xp 00000000 08:01 43 /usr/lib/libc.so.6\n"
                    "7f0000300000-7f0000301000 rw-p 00000000 00:00 0\n")
    (m,) = file_mappings(maps=maps)
    assert (m.start, m.end, m.offset, m.path) == (0x7F0000000000, 0x7F0000100000, 0x1000, "/data/model-00001.safetensors")
    assert file_mappings(maps=tmp_path / "absent") == []


def test_quantize_reports_the_weights_it_owned(tiny_llama, tmp_path):
    """The stage's record says how much it moved: a bfloat16 source loaded in bfloat16 is all views."""
    import torch
    from transformers import AutoModelForCausalLM

    from raipack.stages.quantize.quark_awq import quantize

    src = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(str(tiny_llama), dtype=torch.bfloat16).save_pretrained(src)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny_llama / name).exists():
            (src / name).write_bytes((tiny_llama / name).read_bytes())
    record = quantize(src, tmp_path / "q", algorithm="rtn", group_size=128)
    assert record["dtype"] == "bfloat16"
    owned = record["weights_owned"]
    assert owned["tensors"] > 10 and owned["bytes"] > 1 << 20
    assert owned["kept_mapped_bytes"] > 0  # the token embedding, which Quark never writes, stays mapped


def _rss_file() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("RssFile:"))


def test_the_kept_views_pages_are_given_back_and_read_again_the_same(tmp_path):
    """release_resident_pages: a kept (never written) view's pages leave this process's resident memory and fault
    back in with the same bytes; a tensor of its own is not touched."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from raipack.stages.quantize.owned import release_resident_pages

    cfg = LlamaConfig(hidden_size=256, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=32768,
                      tie_word_embeddings=False)
    built = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    src = tmp_path / "m"
    built.save_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.bfloat16)
    head = model.get_output_embeddings().weight  # 16 MiB of bfloat16
    own_mapped_tensors(model, keep=[head])
    expected = head.detach().clone()
    with torch.no_grad():
        assert float(head.float().abs().sum()) > 0  # every page of the head read: resident
    before = _rss_file()
    released = release_resident_pages([head, model.model.norm.weight, None])
    assert head.numel() * 2 - 8192 <= released <= head.numel() * 2  # the head's whole pages; the owned norm is not a view
    assert before - _rss_file() >= released * 0.9
    assert torch.equal(head, expected)  # read again from the page cache, the same bytes
    assert release_resident_pages([torch.from_numpy(np.ones(4096, np.float32))]) == 0
