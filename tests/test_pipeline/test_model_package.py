"""ONNX Runtime model packages (pipeline/modelpackage, docs/model_package.md): one model's reference
packages (NPU 4K, NPU 16K, hybrid) and their export, found through each package's lineage in a build
cache, assembled into one package; checked variant by variant; its CPU variant loaded by
onnxruntime-genai on this machine. Built from the session's shared reference packages only."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from factory import reference_export, reference_package
from raipack.cli import main
from raipack.core import manifest
from raipack.core.errors import RaipackError
from raipack.modelpackage import layout, resolve
from raipack.modelpackage.assemble import assemble_model_package, assemble_model_packages
from raipack.validate import validate

TARGETS = {"reference-4K": "1.8.0-npu-4K", "reference-16K": "1.8.0-npu-16K", "reference-1.8.0-hybrid": "1.8.0-hybrid"}
KEY = "e" * 64


def _built(root: Path) -> tuple[list[Path], Path]:
    """The three reference packages as a build leaves them: each manifest's lineage names the export
    stage's cache key, and the cache holds that export (a copy of the reference export)."""
    cache = root / "cache"
    entry = cache / "stages" / "export" / KEY
    shutil.copytree(reference_export()[0], entry)
    manifest.write(entry, "oga", stage={"name": "export", "version": "1", "config": {}})
    packages = []
    for pid in TARGETS:
        pkg = root / "build" / pid
        shutil.copytree(reference_package(pid), pkg)
        doc = json.loads((pkg / "manifest.json").read_text())
        doc["lineage"] = {"inputs": [], "stages": [{"name": "export", "version": "1", "cache_key": KEY}]}
        (pkg / "manifest.json").write_text(json.dumps(doc))
        packages.append(pkg)
    return packages, cache


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return _built(tmp_path_factory.mktemp("mp-build"))


@pytest.fixture(scope="module")
def package(built, tmp_path_factory):
    packages, cache = built
    out = tmp_path_factory.mktemp("mp-out")
    results = assemble_model_packages({"models/tiny": [{"status": "built", "package": str(p)} for p in packages] + [{"status": "failed", "package": None}]}, out, cache_root=cache)
    assert results["models/tiny"]["status"] == "built", results
    return Path(results["models/tiny"]["package"])


def _copy(package: Path, tmp_path: Path) -> Path:
    dst = tmp_path / package.name
    shutil.copytree(package, dst, symlinks=True)
    return dst


def test_layout_follows_the_format_and_shares_the_tokenizer_once(package):
    assert package.name == "tiny.ortpackage"
    doc = json.loads((package / "manifest.json").read_text())
    variants = doc["components"]["model"]["variants"]
    assert list(variants) == [*TARGETS.values(), "cpu"]
    assert variants["cpu"] == {"ep": "CPUExecutionProvider", "device": "cpu"}
    assert variants["1.8.0-npu-16K"] == {"ep": "RyzenAIExecutionProvider", "device": "npu", "compatibility_string": "1.8.0-npu-16K"}
    assets = sorted((package / "shared_assets").iterdir())
    assert len(assets) == 1 and {p.name for p in assets[0].iterdir()} == {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    hex_ = assets[0].name.removeprefix("sha256-")
    for name in variants:
        genai = json.loads((package / name / "genai_config.json").read_text())
        assert genai["model"]["tokenizer_dir"] == f"sha256:{hex_}"
        assert not (package / name / "tokenizer.json").exists()
    import onnxruntime as ort

    # ONNX Runtime's own model package code agrees: the digest, the manifest, the variant it picks here
    assert ort.ModelPackage.compute_directory_hash(str(assets[0])) == f"sha256:{hex_}" == f"sha256:{layout.directory_digest(assets[0])}"
    ctx = ort.ModelPackageContext(str(package))
    assert ctx.get_variant_names("model") == list(variants)
    assert Path(ctx.resolve_string_ref(f"sha256:{hex_}")).resolve() == assets[0].resolve()
    chosen = ctx.select_component("model", ort.ModelPackageOptions(ort.SessionOptions()))
    assert chosen.get_selected_variant_name() == resolve.select(package).name == "cpu"


def test_validates_clean_with_each_variant_under_its_own_profile(package):
    result = validate(package, verify_hashes=True)
    assert result.profile == "ort-model-package"
    assert [f for f in result.findings if f.severity in ("error", "warning")] == []
    for part in ("1.8.0-npu-4K: reference-4K", "1.8.0-npu-16K: reference-16K", "1.8.0-hybrid: reference-1.8.0-hybrid", "cpu: oga-export"):
        assert part in result.profile_reason
    assert {"MP001", "MP002", "MP003", "MP004", "RP801"} <= set(result.checks_run)


def test_onnxruntime_genai_loads_the_cpu_variant_and_generates(package, tmp_path):
    og = pytest.importorskip("onnxruntime_genai")
    with pytest.raises(Exception, match="OrtModelPackageApi"):  # 0.18's gap, docs/model_package.md
        og.Model(str(package))
    variant, folder = resolve.materialize(package, tmp_path / "cpu")
    assert variant.name == "cpu" and (folder / "tokenizer.json").is_file()
    assert (folder / "tokenizer.json").stat().st_ino == next((package / "shared_assets").iterdir()).joinpath("tokenizer.json").stat().st_ino

    def generate(path: Path) -> list[int]:
        model = og.Model(str(path))
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=24, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(og.Tokenizer(model).encode("Paris is the capital of"))
        while not gen.is_done():
            gen.generate_next_token()
        return list(gen.get_sequence(0))

    tokens = generate(folder)
    assert len(tokens) == 24 and tokens == generate(reference_export()[0])


def _errors(result):
    return [f for f in result.findings if f.severity == "error"]


def test_a_broken_variant_fails_naming_it(package, tmp_path, capsys):
    pkg = _copy(package, tmp_path)
    (pkg / "1.8.0-npu-16K" / "model.pb.bin").unlink()
    errors = _errors(validate(pkg))
    assert errors and all(f.message.endswith(" (variant 1.8.0-npu-16K)") and f.path.startswith("1.8.0-npu-16K/") for f in errors)
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", str(pkg)])
    assert exit_info.value.code == 1 and "1.8.0-npu-16K/model.pb.bin" in capsys.readouterr().out


def test_a_changed_shared_asset_or_a_wrong_reference_is_found(package, tmp_path):
    pkg = _copy(package, tmp_path)
    asset = next((pkg / "shared_assets").iterdir())
    (asset / "chat_template.jinja").write_text("{{ messages }}")
    genai = pkg / "cpu" / "genai_config.json"
    doc = json.loads(genai.read_text())
    doc["model"]["tokenizer_dir"] = "sha256:" + "0" * 64
    genai.write_text(json.dumps(doc))
    by_id = {}
    for f in _errors(validate(pkg)):
        by_id.setdefault(f.check_id, []).append(f)
    assert [f.path for f in by_id["MP004"]] == [asset.relative_to(pkg).as_posix()]
    assert by_id["MP003"][0].message.startswith("variant cpu: sha256:000") and by_id["MP003"][0].pointer == "/model/tokenizer_dir"


def test_a_missing_variant_folder_and_a_bad_manifest(package, tmp_path):
    pkg = _copy(package, tmp_path)
    shutil.rmtree(pkg / "1.8.0-hybrid")
    assert [(f.check_id, f.path) for f in _errors(validate(pkg))] == [("MP002", "1.8.0-hybrid")]
    doc = json.loads((pkg / "manifest.json").read_text())
    doc["components"]["model"]["variants"]["cpu"]["ep"] = "cpu"
    (pkg / "manifest.json").write_text(json.dumps(doc))
    found = _errors(validate(pkg))
    assert [(f.check_id, f.pointer) for f in found] == [("MP001", "/components/model/variants/cpu/ep")]


def test_assembly_refuses_what_it_cannot_package_and_leaves_nothing(built, tmp_path):
    packages, cache = built
    out = tmp_path / "out"
    stranger = tmp_path / "amd"
    shutil.copytree(packages[0], stranger)
    (stranger / "manifest.json").unlink()
    with pytest.raises(RaipackError, match="manifest.json is missing, incomplete or names no target_profile"):
        assemble_model_package([packages[1], stranger], out / "x.ortpackage", cache_root=cache)
    broken = tmp_path / "broken"
    shutil.copytree(packages[1], broken)
    (broken / "model.pb.bin").unlink()  # its variant fails validation after everything was written
    with pytest.raises(RaipackError, match=r"fails validation: 1.8.0-npu-16K/.*\(variant 1.8.0-npu-16K\)"):
        assemble_model_package([packages[0], broken], out / "x.ortpackage", cache_root=cache)
    assert list(out.iterdir()) == []  # no package, no staging folder
    results = assemble_model_packages({"a": [{"status": "built", "package": str(stranger)}], "b": [{"status": "failed", "package": None}]}, out, cache_root=cache)
    assert results["a"]["status"] == "failed" and "target_profile" in results["a"]["error"] and results["b"]["status"] == "skipped"
    assert list(out.iterdir()) == []


def test_a_zoo_holds_model_packages_beside_plain_packages(package, tmp_path):
    from raipack.validate import expand, validate_all

    zoo = tmp_path / "zoo"
    shutil.copytree(reference_package("reference-4K"), zoo / "plain")
    _copy(package, zoo)
    assert expand([zoo]) == [zoo / "plain", zoo / package.name]
    assert [r.profile for r in validate_all([zoo])] == ["reference-4K", "ort-model-package"]


def test_a_manifest_with_a_duplicate_key_is_an_error(package, tmp_path):
    """Issue 24: duplicate keys in manifest.json passed (json.loads keeps the last); raipack's one strict reader refuses them."""
    pkg = _copy(package, tmp_path)
    text = (pkg / "manifest.json").read_text().rstrip()
    assert text.endswith("}")
    (pkg / "manifest.json").write_text(text[:-1] + ', "schema_version": "1.0"}')
    found = _errors(validate(pkg))
    assert found and any("gives the key 'schema_version' 2 times" in f.message for f in found), [(f.check_id, f.message) for f in found]
