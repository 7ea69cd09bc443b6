"""`.gitattributes` read as git reads it (pipeline/core/gitattributes.py), checked against git itself:
every case is asked of `git check-attr` in a repository this test creates (its own folder and an
empty configuration, never a package), and raipack must give the same answer."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from raipack.core.gitattributes import Attributes, escape_glob, quote, unquote

PATHS = [
    "model.bin", "model.pb.bin", "model.onnx", "model.onnx.data", "sub/model.bin", "cache/a.const", "cache/deep/b.const",
    "dd_metastate_Llm_Token_MatMulNBits_2_0.fconst", "README.md", "a b.dat", "x[1].dat", "saved_model/v/w.pb",
    "other/saved_model/v/w", "notes/readme.txt", "notes/deep/readme.txt", "Model.BIN", "weights-1.safetensors",
    "events.out.tfevents.1", "dir/file", "abc", "a/b/c/d", "lib.so.1", "q?x", "star*name",
]

CASES = {
    "basename kinds": "*.bin filter=lfs\n*.onnx.data filter=lfs\n",
    "anchored and double star": "/model.onnx filter=lfs\ncache/** filter=lfs\nsaved_model/**/* filter=lfs\n**/readme.txt filter=lfs\n",
    "middle double star": "a/**/d filter=lfs\nnotes/**/readme.txt filter=lfs\n",
    "later lines win": "*.bin filter=lfs\nmodel.pb.bin -filter\nsub/*.bin !filter\n*.dat filter=lfs\nx* filter=other\n",
    "folder-only pattern gives files nothing": "cache/ filter=lfs\nsaved_model/ filter=lfs\n",
    "negative patterns are ignored": "*.md filter=lfs\n!README.md -filter\n",
    "brackets and classes": "[a-c]* filter=lfs\n*[[:digit:]].* filter=lfs\n[!m]odel.* filter=lfs\nx\\[1\\].dat filter=lfs\n",
    "quoted pattern and escapes": '"a b.dat" filter=lfs\nq\\?x filter=lfs\nstar\\*name filter=lfs\n',
    "comments and blanks": "# *.bin filter=lfs\n\n   *.onnx filter=lfs\n\t# indented comment\n",
    "star does not cross folders": "cache/*.const filter=lfs\ndir/* filter=lfs\n*/file -filter\n",
    "case matters": "*.BIN filter=lfs\n",
    "macros": "[attr]big filter=lfs diff=lfs\n*.so.* big\nbinary -filter\n*.safetensors big\n",
    "unset by the unspecified form": "* filter=lfs\nREADME.md !filter\nnotes/** -filter\n",
    "hub default file": (Path(__file__).parents[1] / "data" / "amd_gitattributes.txt"),
}


def _git_answers(tmp: Path, files: dict[str, str], paths: list[str]) -> dict[str, str]:
    repo = tmp / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir()
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "LC_ALL": "C"}
    subprocess.run(["git", "init", "-q", str(repo)], check=True, env=env)
    for rel, text in files.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    out = subprocess.run(["git", "-c", "core.quotePath=false", "check-attr", "-z", "filter", "--", *paths], cwd=repo, env=env,
                         check=True, capture_output=True).stdout.decode()
    fields = out.split("\0")
    return {fields[i]: fields[i + 2] for i in range(0, len(fields) - 2, 3)}


def _ours(files: dict[str, str], paths: list[str]) -> dict[str, str]:
    attrs = Attributes(files)
    out = {}
    for p in paths:
        v = attrs.value(p, "filter")
        out[p] = "set" if v is True else "unset" if v is False else "unspecified" if v is None else v
    return out


needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed: nothing to compare the matcher with")


@needs_git
@pytest.mark.parametrize("case", sorted(CASES))
def test_filter_attribute_is_what_git_says(case, tmp_path):
    text = CASES[case] if isinstance(CASES[case], str) else CASES[case].read_text()
    files = {".gitattributes": text}
    assert _ours(files, PATHS) == _git_answers(tmp_path, files, PATHS)


@needs_git
def test_nested_files_deeper_wins_and_anchor_to_their_folder(tmp_path):
    files = {".gitattributes": "*.const filter=lfs\n*.txt filter=lfs\n", "cache/.gitattributes": "deep/*.const -filter\n/a.const filter=x\n",
             "notes/.gitattributes": "readme.txt !filter\n"}
    answers = _git_answers(tmp_path, files, PATHS)
    assert _ours(files, PATHS) == answers
    assert answers["cache/deep/b.const"] == "unset" and answers["cache/a.const"] == "x"  # the case is not trivial


def test_quote_round_trips_and_escape_matches_only_itself():
    for name in ("a b.dat", 'q"x', "tab\there", "plain.bin", "#hash"):
        quoted = quote(name)
        assert (unquote(quoted) if quoted.startswith('"') else quoted) == name
    attrs = Attributes({".gitattributes": f"{quote(escape_glob('x[1]*.dat'))} filter=lfs\n"})
    assert attrs.in_lfs("x[1]*.dat") and not attrs.in_lfs("x1abc.dat")


def test_overlong_lines_and_bad_attribute_names_are_skipped_as_git_skips_them():
    attrs = Attributes({".gitattributes": "*.bin filter=lfs " + "x" * 2100 + "\n*.onnx fil@ter=lfs\n*.data filter=lfs\n"})
    assert not attrs.in_lfs("model.bin") and not attrs.in_lfs("model.onnx") and attrs.in_lfs("model.data")
