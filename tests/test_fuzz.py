"""One fuzz harness for every command that reads untrusted input.

Seeded mutations of packages (AMD layouts from the factory and a real
raipack-built one), of a model folder and of the command's own arguments are
fed to `validate`, `inspect`, `tune`, `run` and `build --until quantize`,
in-process through the CLI's `main`. Each case asserts what raipack promises
about hostile input:

- no traceback: `main` ends with SystemExit and a documented exit code;
- nothing written outside what the command owns (the output folder and the
  cache for `build`, `genai_config.json` and its backup for `tune`, nothing
  at all for `validate`, `inspect` and `run`);
- nothing from the input ran: no marker file written by a booby-trapped
  pickle, Python module, shared library, git hook or chat template;
- no hang: a case that blocks (a FIFO opened for reading) fails at its alarm.

The seed of a case is its id (`validate-17`), so a failure replays alone with
`pytest tests/test_fuzz.py -k validate-17`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import pickle
import random
import shutil
import signal
import stat
import subprocess
import traceback
from pathlib import Path

import pytest

from factory import make_package
from shared_fixtures import make_tiny_llama

COUNTS = {"validate": 120, "inspect": 40, "tune": 60, "run": 40, "build": 45}
EXIT_CODES = {  # the documented exit codes of each command (README, --help)
    "validate": {0, 1, 2, 3},
    "inspect": {0, 1, 2, 3},
    "tune": {0, 1, 2, 3},
    "run": {0, 1, 2, 3},
    "build": {0, 1, 2},
}
PROFILES = ["1.8.0-npu-16K", "1.8.0-npu-4K", "1.7.1-npu-16K", "1.6-npu", "1.8.0-hybrid", "1.3-hybrid", "1.3-npu"]
CASE_SECONDS = 60  # a case still running then is a hang

# build cases share one worker (one Quark import), and so do run cases (one onnxruntime and
# tokenizer import); the others spread over every worker
CASES = [pytest.param(f"{cmd}-{i}", id=f"{cmd}-{i}", marks=[pytest.mark.xdist_group(f"fuzz-{cmd}")] if cmd in ("build", "run") else [])
         for cmd, n in COUNTS.items() for i in range(n)]


# ---------------------------------------------------------------------------- booby traps

class Unpickled:
    """Unpickling this writes the marker: a pickle that is loaded fails the case."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


TRAP_SO_SOURCE = r"""
#include <stdio.h>
__attribute__((constructor)) static void trap(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("loaded", f); fclose(f); }
}
"""


@pytest.fixture(scope="session")
def trap_library(tmp_path_factory) -> tuple[Path, Path]:
    """A shared library whose constructor writes a marker, and that marker's path."""
    d = tmp_path_factory.mktemp("trap-so")
    marker = d / "shared-library-loaded"
    src = d / "trap.c"
    src.write_text(TRAP_SO_SOURCE)
    lib = d / "libtrap.so"
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(lib), str(src)], check=True)
    return lib, marker


# ---------------------------------------------------------------------------- seeds

@pytest.fixture(scope="session")
def fused_package(reference_packages) -> Path:
    """A real package written by the fuse stage on a tiny model (read-only)."""
    return reference_packages["reference-16K"]


@pytest.fixture(scope="session")
def model_folder(tmp_path_factory) -> Path:
    """A tiny Hugging Face model folder (read-only: cases copy it)."""
    return make_tiny_llama(tmp_path_factory.mktemp("fuzz-model") / "model", hidden=128, intermediate=256)


# ---------------------------------------------------------------------------- mutations

WEIRD_VALUES = [-1, 0, -4096, 2**63, 2**31 - 1, 0.5, 1e308, "abc", "", "4096", None, [], {}, True, False,
                "\x1b[31mred\x1b[0m", "../../../etc/passwd", "/dev/zero", "C:\\Windows\\evil.dll",
                "x" * 100_000, [1] * 5000]


def _json_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.json") if p.is_file() and not p.is_symlink())


def _any_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def _paths_in(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths_in(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:50]):
            yield from _paths_in(v, prefix + (i,))


def _set(doc, path, value):
    if not path:
        return value
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return doc


def _random_json(rng, root):
    """(a JSON file of the folder, its parsed document), or (None, why there is none)."""
    files = _json_files(root)
    if not files:
        return None, "no json"
    f = rng.choice(files)
    try:
        return f, json.loads(f.read_text())
    except ValueError:
        return None, "json already broken"


def m_json_value(rng, root, ctx):
    """A JSON value anywhere in a JSON file becomes a weird one."""
    f, doc = _random_json(rng, root)
    if f is None:
        return doc
    paths = list(_paths_in(doc))
    path = rng.choice(paths)
    value = rng.choice(WEIRD_VALUES)
    if rng.random() < 0.3:  # a nested value 900 deep
        value = json.loads("[" * 900 + "]" * 900)
    f.write_text(json.dumps(_set(doc, path, value)))
    return f"{f.name}{list(path)} = {str(value)[:40]!r}"


def m_json_delete(rng, root, ctx):
    """A key of a JSON object is removed."""
    f, doc = _random_json(rng, root)
    if f is None:
        return doc
    objects = [p for p in _paths_in(doc) if isinstance(_get(doc, p), dict) and _get(doc, p)]
    if not objects:
        return "no object"
    p = rng.choice(objects)
    key = rng.choice(list(_get(doc, p)))
    del _get(doc, p)[key]
    f.write_text(json.dumps(doc))
    return f"{f.name}{list(p)} without {key!r}"


def _get(doc, path):
    for p in path:
        doc = doc[p]
    return doc


def m_json_text(rng, root, ctx):
    """JSON text that parsers disagree on or that breaks them."""
    files = _json_files(root)
    if not files:
        return "no json"
    f = rng.choice(files)
    text = f.read_text(errors="replace")
    kind = rng.choice(["truncate", "dup-key", "inf", "nan", "deep", "bytes", "bom", "empty", "not-object"])
    if kind == "truncate":
        text = text[: rng.randrange(len(text) + 1)]
    elif kind == "dup-key" and text.lstrip().startswith("{"):
        i = text.index("{") + 1
        text = text[:i] + '"hybrid_opt_token_backend": "cpu", "max_length": 1, ' + text[i:].replace('"max_length"', '"max_length": 2, "max_length"', 1)
    elif kind == "inf":
        text = text.replace("4096", "1e999", 1).replace(": 2,", ": Infinity,", 1)
    elif kind == "nan":
        text = text.replace(": 1,", ": NaN,", 1).replace("1e-05", "NaN")
    elif kind == "deep":
        text = "[" * 100_000 + "]" * 100_000
    elif kind == "bytes":
        f.write_bytes(text.encode()[:50] + b"\xff\xfe\x80" + text.encode()[50:])
        return f"{f.name}: invalid UTF-8"
    elif kind == "bom":
        text = "\ufeff" + text
    elif kind == "empty":
        text = ""
    elif kind == "not-object":
        text = json.dumps(rng.choice([[1, 2], "text", 42, None]))
    f.write_text(text)
    return f"{f.name}: {kind}"


def _random_file(rng, root):
    """A regular file of the folder (symlinks not followed), or None."""
    files = _any_files(root)
    return rng.choice(files) if files else None


def m_file_bytes(rng, root, ctx):
    """A file is truncated, grown, or has bytes flipped in place (same size)."""
    f = _random_file(rng, root)
    if f is None:
        return "no files"
    size = f.stat().st_size
    kind = rng.choice(["truncate", "flip", "flip", "zero", "grow"])
    if kind == "truncate":
        os.truncate(f, rng.randrange(size + 1) if size else 0)
    elif kind == "grow":
        with open(f, "ab") as fh:
            fh.write(os.urandom(rng.randrange(1, 4096)))
    elif size:
        data = bytearray(f.read_bytes())
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(data))
            data[i] = 0 if kind == "zero" else data[i] ^ (1 << rng.randrange(8))
        f.write_bytes(bytes(data))
    return f"{f.relative_to(root)}: {kind}"


def m_delete(rng, root, ctx):
    f = _random_file(rng, root)
    if f is None:
        return "no files"
    f.unlink()
    return f"{f.relative_to(root)} deleted"


def m_lfs_pointer(rng, root, ctx):
    f = _random_file(rng, root)
    if f is None:
        return "no files"
    f.write_text(f"version https://git-lfs.github.com/spec/v1\noid sha256:{'ab' * 32}\nsize {rng.randrange(1, 1 << 40)}\n")
    return f"{f.relative_to(root)} -> LFS pointer"


def m_special(rng, root, ctx):
    """A file becomes a symlink out of the package, to a device, a loop, a FIFO or a folder."""
    f = _random_file(rng, root)
    if f is None:
        return "no files"
    f.unlink()
    kind = rng.choice(["outside", "etc", "zero", "loop", "fifo", "dir", "dangling"])
    if kind == "outside":
        f.symlink_to(ctx["outside"] / "secret.json")
    elif kind == "etc":
        f.symlink_to("/etc/passwd")
    elif kind == "zero":
        f.symlink_to("/dev/zero")
    elif kind == "loop":
        f.symlink_to(f.name)
    elif kind == "fifo":
        os.mkfifo(f)
    elif kind == "dir":
        f.mkdir()
        (f / "inner.json").write_text("{}")
    else:
        f.symlink_to("does-not-exist")
    return f"{f.relative_to(root)} -> {kind}"


def m_names(rng, root, ctx):
    """File names a terminal or an XML report chokes on."""
    kind = rng.choice(["non-utf8", "ansi", "newline", "long"])
    name = {"non-utf8": os.fsdecode(b"bad\xff\xfe.json"), "ansi": "\x1b[2J\x1b[31mevil.json",
            "newline": "two\nlines.json", "long": "n" * 250 + ".json"}[kind]
    (root / name).write_text("{}")
    return f"file named {kind}"


def m_pickle(rng, root, ctx):
    """A pickle that writes the marker when loaded, under a weights-like name."""
    name = rng.choice(["pytorch_model.bin", "model.bin", "training_args.bin", "model.safetensors", "model.pkl", "optimizer.pt"])
    (root / name).write_bytes(pickle.dumps(Unpickled(str(ctx["markers"] / "unpickled"))))
    return f"pickle as {name}"


def m_remote_code(rng, root, ctx):
    """A modeling file that writes the marker on import, wired in through auto_map."""
    (root / "modeling_evil.py").write_text(f"open({str(ctx['markers'] / 'imported')!r}, 'w').write('pwned')\n")
    (root / "tokenization_evil.py").write_text(f"open({str(ctx['markers'] / 'imported')!r}, 'w').write('pwned')\n")
    target = rng.choice(["config.json", "tokenizer_config.json"])
    path = root / target
    try:
        doc = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    doc["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil", "AutoTokenizer": ["tokenization_evil.Evil", None]}
    path.write_text(json.dumps(doc))
    return f"auto_map in {target}"


def m_shared_library(rng, root, ctx):
    """The trap library beside the package under the RyzenAI provider's name, or named as a custom-op library."""
    lib = ctx["trap_lib"]
    name = rng.choice(["libonnxruntime_providers_ryzenai.so", "onnx_custom_ops.so", "libcustom_ops.so"])
    shutil.copy(lib, root / name)
    ctx["cwd"] = root  # built or run from inside the folder, as a user would
    gc = root / "genai_config.json"
    if gc.is_file():
        try:
            doc = json.loads(gc.read_text())
            so = doc["model"]["decoder"].setdefault("session_options", {})
            so["custom_ops_library"] = name
            gc.write_text(json.dumps(doc))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    return f"shared library {name}"


def m_chat_template(rng, root, ctx):
    """A chat template that tries to leave Jinja's sandbox."""
    marker = ctx["markers"] / "template"
    payload = rng.choice([
        "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% for x in range(10**9) %}{% endfor %}",
        "{{ messages[0]['content'] | attr('__class__') }}",
    ])
    path = root / "tokenizer_config.json"
    try:
        doc = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    doc["chat_template"] = payload
    path.write_text(json.dumps(doc))
    (root / "chat_template.jinja").write_text(payload)
    return "chat template escape"


def m_git(rng, root, ctx):
    """The package is a git clone whose config runs a command (fsmonitor, hooks)."""
    marker = ctx["markers"] / "git"
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True, env=env)
    subprocess.run(git + ["add", "-A"], check=True, env=env)
    subprocess.run(git + ["commit", "-qm", "x"], check=True, env=env)
    subprocess.run(git + ["config", "core.fsmonitor", f"touch {marker}; echo"], check=True, env=env)
    hooks = root / ".git" / "hooks"
    for hook in ("post-checkout", "post-index-change", "pre-command"):
        (hooks / hook).write_text(f"#!/bin/sh\ntouch {marker}\n")
        (hooks / hook).chmod(0o755)
    ctx["argv_extra"] = ["--verify-hashes"]
    return "git clone with fsmonitor and hooks"


PACKAGE_MUTATIONS = [m_json_value, m_json_value, m_json_delete, m_json_text, m_file_bytes, m_delete, m_lfs_pointer,
                     m_special, m_names, m_pickle, m_remote_code, m_shared_library, m_chat_template, m_git]
MODEL_MUTATIONS = [m_json_value, m_json_value, m_json_value, m_json_delete, m_json_text, m_json_text, m_file_bytes,
                   m_delete, m_lfs_pointer, m_special, m_pickle, m_remote_code, m_shared_library, m_chat_template]


# ---------------------------------------------------------------------------- running a case

def _snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under root: type, size and mtime (symlinks not followed), hash of small files."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):  # a folder changes when something inside it does
                out[os.path.relpath(p, root)] = (stat.S_IFDIR,)
                continue
            digest = ""
            if stat.S_ISREG(st.st_mode) and st.st_size < (1 << 20):
                with open(p, "rb") as fh:
                    digest = hashlib.sha1(fh.read()).hexdigest()
            out[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, digest)
    return out


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"still running after {CASE_SECONDS} s")


UNSET = ("RYZENAI_EP_PATH", "RYZEN_AI_INSTALLATION_PATH")  # no provider library of this machine in a case


def invoke(argv: list[str], cwd: Path, env: dict[str, str]):
    """Run the CLI in this process; return (exit code, output, escaped exception text)."""
    from raipack.cli import main

    old_cwd, old_env = os.getcwd(), dict(os.environ)  # stages tune the process environment (allocator, threads)
    out, err = io.StringIO(), io.StringIO()
    escaped = ""
    code = None
    os.chdir(cwd)
    os.environ.update(env)
    for name in UNSET:
        os.environ.pop(name, None)
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a traceback the user would have seen (or a hang)
        escaped = traceback.format_exc()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return code, out.getvalue() + err.getvalue(), escaped


def _allowed(cmd: str, rel: str, target_rel: str) -> bool:
    """May the command have created or changed this path (relative to the case root)?"""
    if rel in ("cache", "cache/xdg") or rel.startswith("cache/xdg/Microsoft"):  # onnxruntime's device id in the user's cache
        return True
    if cmd == "build":
        return rel.startswith(("out", "cache"))
    if cmd == "tune":
        name = rel.rsplit("/", 1)[-1]
        # genai_config.json, its backup and its temporary, and raipack's manifest.json (rewritten in a package raipack built)
        return rel.startswith(target_rel + "/") and (name in ("genai_config.json", "manifest.json")
                                                     or name.startswith(("genai_config.json.", ".genai_config.json.", ".manifest.json.")))
    return False


def _argv(cmd: str, rng: random.Random, target: Path, case_root: Path, ctx: dict) -> list[str]:
    if cmd == "validate":
        argv = ["validate", str(target)] + rng.choice([[], ["--format", "json"], ["--format", "junit", "-o", str(case_root / "cwd" / "r.xml")],
                                                      ["--format", "sarif"], ["--strict"], ["--verify-hashes"], ["--profile", rng.choice(PROFILES)]])
        ctx.setdefault("allowed_extra", set()).add("cwd/r.xml")
        return argv + ctx.get("argv_extra", [])
    if cmd == "inspect":
        return ["inspect", str(target)] + rng.choice([[], ["--json"]])
    if cmd == "tune":
        opt = rng.choice(["--max-length", "--chunk-size", "--max-prompt"])
        value = rng.choice(["4096", "2048", "16384", "1024", "3000", "0", "-5", "abc", "99999999", "4097"])
        return ["tune", str(target), opt, value] + rng.choice([[], ["--dry-run"], ["--sdk-version", rng.choice(["1.8.0", "1.6.0", "9.9"])]])
    if cmd == "run":
        prompt = rng.choice(["What is the capital of France?", "", "\udcff\udcfe invalid bytes", "\x1b[2J" * 10, "word " * 5000, "Paris"])
        return ["run", str(target), "--prompt", prompt, "-n", str(rng.choice([1, 4, 8]))] + rng.choice([[], ["--raw"], ["--sdk-version", "1.3.0"]])
    return ["build", str(target), "--until", "quantize", "--output", str(case_root / "out"), "--algorithm", "rtn", "--group-size", "64",
            "--quiet"] + rng.choice([[], ["--profile", "1.8.0-npu-4K"], ["--trust-remote-code"]])


@pytest.mark.fuzz
@pytest.mark.parametrize("case", CASES)
def test_fuzz(case, tmp_path, trap_library, request):
    cmd = case.rsplit("-", 1)[0]
    rng = random.Random(case)
    lib, so_marker = trap_library
    root = tmp_path / "case"
    markers, outside, cwd = root / "markers", root / "outside", root / "cwd"
    for d in (markers, outside, cwd):
        d.mkdir(parents=True)
    (outside / "secret.json").write_text('{"secret": true}')
    ctx = {"markers": markers, "outside": outside, "trap_lib": lib, "cwd": cwd}

    if cmd == "build":
        target = root / "model"
        shutil.copytree(request.getfixturevalue("model_folder"), target)
        mutations = MODEL_MUTATIONS
    elif cmd == "run" or (cmd in ("validate", "inspect", "tune") and rng.random() < 0.25):
        target = root / "pkg" / "Tiny_rai_1.8.0_npu_16K"
        shutil.copytree(request.getfixturevalue("fused_package"), target, symlinks=True)
        mutations = PACKAGE_MUTATIONS
    else:
        target = make_package(root / "pkg", rng.choice(PROFILES))
        mutations = PACKAGE_MUTATIONS
    for d in target.rglob("*"):  # the copies keep the fixture's read-only modes
        if d.is_dir() and not d.is_symlink():
            d.chmod(0o755)
        elif d.is_file() and not d.is_symlink():
            d.chmod(0o644)
    applied = [m(rng, target, ctx).replace("\n", " ") for m in rng.sample(mutations, rng.choice([1, 1, 2, 3]))]
    argv = _argv(cmd, rng, target, root, ctx)
    before = _snapshot(root)
    env = {"RAIPACK_CACHE": str(root / "cache"), "XDG_CACHE_HOME": str(root / "cache" / "xdg"), "NO_COLOR": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    code, output, escaped = invoke(argv, ctx["cwd"], env)
    what = f"{case}: raipack {' '.join(a[:60] for a in argv[:1])} after {applied}"

    assert not escaped, f"{what}\n{escaped}\n{output[-2000:]}"
    assert code in EXIT_CODES[cmd], f"{what}: exit {code}, documented {sorted(EXIT_CODES[cmd])}\n{output[-2000:]}"
    assert "Traceback (most recent call last)" not in output, f"{what}\n{output[-3000:]}"
    assert not any(markers.iterdir()), f"{what}: input code ran: {sorted(p.name for p in markers.iterdir())}"
    assert not so_marker.exists(), f"{what}: a shared library from the input was loaded"
    if code != 0:
        assert output.strip(), f"{what}: exit {code} without a word"
    after = _snapshot(root)
    target_rel = target.relative_to(root).as_posix()
    changed = sorted(rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)
                     and not _allowed(cmd, rel, target_rel) and rel not in ctx.get("allowed_extra", ()))
    assert not changed, f"{what}: wrote outside its output: {changed[:10]}"
    if cmd == "build" and code != 0:  # a refused build leaves nothing that looks finished
        finished = [p for p in (root / "out").rglob("manifest.json")] if (root / "out").exists() else []
        assert not finished, f"{what}: refused but left {finished}"


# ============================================================================ the input surface (issue 24)
#
# Five more inputs, each read in-process by the use case the command calls before it spends anything:
# an eval task folder (raipack eval's folder check and the folder it writes for lm-eval), a batch matrix
# (its loader), a hand-over folder (its reader), an ONNX Runtime model package (`raipack validate`) and
# the report's inputs (their readers and the page's template). Same promises: a RaipackError with its
# documented exit code or a result, no other exception, no marker, nothing written outside, no hang.

INPUT_COUNTS = {"eval": 100, "batch": 100, "handover": 100, "modelpackage": 100, "report": 100}
INPUT_CASES = [pytest.param(f"{kind}-{i}", id=f"{kind}-{i}") for kind, n in INPUT_COUNTS.items() for i in range(n)]

TASK_YAML = ("task: capitals\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: capitals.jsonl\ntest_split: test\n"
             "output_type: multiple_choice\ndoc_to_text: \"{{question}}\"\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: label\n"
             "metric_list:\n  - metric: acc\n")
YAML_ATTACKS = [
    "process_docs: !function utils.process_docs\n", "class: !function utils.Task\n", "x: !!python/object/apply:os.system ['touch {marker}']\n",
    "include: base.txt\n", "include: ../outside.yaml\n", "include: [capitals.yaml]\n", "include: 7\n",
    "metric_list:\n  - metric: ./evm\n", "metric_list:\n  - metric: acc\n    aggregation: ./agg\n", "filter_list:\n  - name: f\n    filter:\n      - function: custom\n",
    "dataset_path: ./ds\n", "dataset_kwargs:\n  data_files: ../outside.jsonl\n", "dataset_kwargs:\n  data_files: [/etc/passwd]\n",
    "dataset_kwargs:\n  trust_remote_code: true\n", "custom_dataset: x\n", "unsafe_code: true\n", "bogus_key: 1\n", "task: [1, 2]\n",
    "metadata:\n  a: &a [x, x, x, x, x, x, x, x, x]\n  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
    "  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]\n  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\n  f: [*e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
    "metadata: " + "[" * 3000 + "]" * 3000 + "\n", "output_type: ranking\n", "<<: {task: other}\n", "task: capitals\n", "\t bad: [\n", "--- \n--- \n",
    "doc_to_text: \"{{ cycler.__init__.__globals__.os.system('touch {marker}') }}\"\n",
]


def _yaml_mutation(rng, folder: Path, ctx) -> str:
    kind = rng.choice(["attack", "attack", "attack", "link", "special", "bytes", "names", "file"])
    target = folder / rng.choice(["capitals.yaml", "extra.yaml", "sub/more.yml"])
    if target.is_symlink() or (target.exists() and not target.is_file()):  # an earlier mutation's FIFO or folder: writing would block
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    if target.parent.is_symlink() or (target.parent.exists() and not target.parent.is_dir()):
        target = folder / "extra.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "attack":
        attack = rng.choice(YAML_ATTACKS).replace("{marker}", str(ctx["markers"] / "ran"))
        base = TASK_YAML if target.name == "capitals.yaml" or rng.random() < 0.5 else TASK_YAML.replace("capitals", "t" + str(rng.randrange(99)))
        target.write_text(attack + base if rng.random() < 0.5 else base + attack)
        return f"{target.name}: {attack[:40]!r}"
    if kind == "link":
        (folder / "sub").mkdir(exist_ok=True)
        other = ctx["outside"] / "tasks"
        other.mkdir(exist_ok=True)
        (other / "evil.yaml").write_text(TASK_YAML + "process_docs: !function utils.process_docs\n")
        name = folder / f"link{rng.randrange(9)}"
        if name.exists() or name.is_symlink():
            return f"{name.name} exists already"
        name.symlink_to(rng.choice([other, folder / "sub", ctx["outside"] / "secret.json", "/etc", "missing"]))
        return f"{name.name} -> link"
    if kind == "file":
        if (folder / "base.txt").exists() or (folder / "base.txt").is_symlink():
            (folder / "base.txt").unlink()
        (folder / "base.txt").write_text(rng.choice(["process_docs: !function utils.process_docs\n", TASK_YAML, "[1, 2]\n", "\x00\x01"]))
        return "base.txt written"
    return {"special": m_special, "bytes": m_file_bytes, "names": m_names}[kind](rng, folder, ctx)


def _eval_case(rng, root: Path, ctx) -> tuple:
    """A capitals task folder, mutated; raipack eval's folder check, then the folder it writes for lm-eval."""
    from raipack.evaluation import taskfolder
    from raipack.evaluation.run import Request, check_request

    folder = root / "tasks"
    folder.mkdir()
    (folder / "capitals.yaml").write_text(TASK_YAML)
    (folder / "capitals.jsonl").write_text('{"question": "Paris is the capital of", "choices": [" France", " Spain"], "label": 0}\n')
    (folder / "utils.py").write_text(f"open({str(ctx['markers'] / 'imported')!r}, 'w').close()\ndef process_docs(ds):\n    return ds\n")
    (folder / "evm").mkdir()
    (folder / "evm" / "evm.py").write_text(f"open({str(ctx['markers'] / 'evaluate-loaded')!r}, 'w').close()\n")
    applied = [_yaml_mutation(rng, folder, ctx) for _ in range(rng.choice([1, 1, 2, 3]))]
    ws = root / "cwd" / "ws"

    def run():
        req = check_request(Request(["capitals"], include_path=folder))
        taskfolder.write(taskfolder.read(req.include_path), ws)
        assert not (ws / "utils.py").exists() and not list(ws.rglob("*.py")), "the written folder holds Python"

    return applied, run, {"cwd/ws"}


def _matrix_text(rng, root: Path, model: Path) -> tuple[str, str]:
    models = rng.choice([1, 2, 3, 40, 2000])
    profiles = rng.sample(["1.8.0-npu-16K", "1.8.0-npu-4K", "1.6-npu", "nope", "", "../x"], rng.choice([1, 2, 3]))
    lines = ['output = "zoo"', f"profiles = {json.dumps(profiles)}"]
    if rng.random() < 0.3:
        lines.append("jobs = " + rng.choice(["0", "-1", "2", '"x"', "1e9"]))
    for i in range(models):
        key = rng.choice(["path", "path", "example", "junk"])
        value = {"path": json.dumps(rng.choice([str(model), "../../etc", "/dev/zero", "missing", str(root / "outside")])),
                 "example": "true", "junk": json.dumps(rng.choice(WEIRD_VALUES[:12]))}[key]
        name = rng.choice([f"m{i}", f"m{i}", "dup", "", "\x1b[2J"])
        lines += ["[[models]]", f"name = {json.dumps(name)}", f"{key} = {value}"]
    if rng.random() < 0.4:
        lines += ["[[overrides]]", f"name = {json.dumps(rng.choice(['a', 'b', '']))}", "[overrides.quantize]",
                  f"{rng.choice(['group_size', 'algorithm', 'grup', 'device'])} = {json.dumps(rng.choice([64, 'awq', 'x', -1, [1]]))}"]
    if rng.random() < 0.3:
        lines += ["[recipe.smoke]", f"{rng.choice(['prompt', 'require_npu', 'nonsense'])} = {json.dumps(rng.choice(['hi', True, 3]))}"]
    text = "\n".join(lines) + "\n"
    kind = rng.choice(["plain"] * 6 + ["truncate", "deep", "bytes", "dup"])
    if kind == "truncate":
        text = text[: rng.randrange(len(text) + 1)]
    elif kind == "deep":
        text += "x = " + "[" * 4000 + "]" * 4000 + "\n"
    elif kind == "bytes":
        text = text[:20] + "\udcff" + text[20:]
    elif kind == "dup":
        text += 'output = "again"\n'
    return text, f"{models} models, {profiles}, {kind}"


def _batch_case(rng, root: Path, ctx) -> tuple:
    from raipack.batch.matrix import load

    model = root / "model"
    shutil.copytree(ctx["model_folder"], model)
    path = root / "matrix.toml"
    text, applied = _matrix_text(rng, root, model)
    if rng.random() < 0.1:
        os.mkfifo(path)
        applied = "the matrix is a FIFO"
    else:
        path.write_bytes(text.encode("utf-8", "surrogateescape"))
    if rng.random() < 0.2:
        m_special(rng, model, ctx) if rng.random() < 0.5 else m_json_text(rng, model, ctx)
    return [applied], lambda: load(path), set()


def _handover_case(rng, root: Path, ctx) -> tuple:
    from raipack.builder import handover

    folder = root / "carry"
    shutil.copytree(ctx["handover_folder"], folder, symlinks=True)
    for d in folder.rglob("*"):
        d.chmod(0o755 if d.is_dir() else 0o644)
    muts = [m_json_value, m_json_delete, m_json_text, m_file_bytes, m_delete, m_special, m_names]
    applied = [m(rng, folder, ctx) for m in rng.sample(muts, rng.choice([1, 1, 2]))]
    if rng.random() < 0.15:
        stage = rng.choice([p for p in folder.iterdir() if p.is_dir()] or [folder])
        if stage != folder:
            shutil.move(stage, ctx["outside"] / stage.name)
            stage.symlink_to(ctx["outside"] / stage.name)
            applied.append(f"{stage.name} is a symlink")

    def run():
        carried = handover.read(folder)
        handover.recipe_from(carried, None, {})

    return applied, run, set()


def _modelpackage_case(rng, root: Path, ctx) -> tuple:
    pkg = root / "Model.ortpackage"
    shutil.copytree(ctx["model_package"], pkg, symlinks=True)
    for d in pkg.rglob("*"):
        if not d.is_symlink():
            d.chmod(0o755 if d.is_dir() else 0o644)
    muts = [m_json_value, m_json_value, m_json_delete, m_json_text, m_file_bytes, m_delete, m_special, m_lfs_pointer, m_names]
    applied = [m(rng, pkg, ctx) for m in rng.sample(muts, rng.choice([1, 1, 2]))]
    return applied, ["validate", str(pkg)] + rng.choice([[], ["--format", "json"], ["--strict"]]), set()


def _report_case(rng, root: Path, ctx) -> tuple:
    from raipack.report import collect, inputs, page

    data = root / "inputs"
    data.mkdir()
    for name, doc in ctx["report_inputs"].items():
        (data / name).write_text(json.dumps(doc))
    muts = [m_json_value, m_json_value, m_json_delete, m_json_delete, m_json_text, m_special]
    applied = [m(rng, data, ctx) for m in rng.sample(muts, rng.choice([1, 1, 2, 3]))]

    def run():
        report = inputs.build_report(data / "report.json")
        bench, evaluation = inputs.bench(data / "bench.json"), inputs.evaluation(data / "eval.json")
        html = page.render(collect.page_data("pkg", ctx["summary"], [], report, bench, evaluation))
        assert "<script" not in html.lower()

    return applied, run, set()


@pytest.fixture(scope="session")
def model_package() -> Path:
    """The factory's ONNX Runtime model package of the reference-4K package (read-only: cases copy it)."""
    from factory import model_package as assembled

    return assembled()


@pytest.fixture(scope="session")
def handover_folder(tmp_path_factory) -> Path:
    """A hand-over of the fake stages (`raipack build --until export --handover`), read-only for the cases."""
    import fake_stages
    from raipack.cli import main

    home = tmp_path_factory.mktemp("fuzz-handover")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAIPACK_CACHE", str(home / "cache"))
        mp.setattr(fake_stages, "CALLS", home / "calls.txt")
        mp.setattr("raipack.builder.stages.get", fake_stages.FAKES.__getitem__)
        mp.chdir(home)
        with pytest.raises(SystemExit) as done:
            main(["build", "--until", "export", "--handover", "carry", "--name", "Tiny"])
        assert done.value.code == 0
    return home / "carry"


@pytest.fixture(scope="session")
def report_inputs(fused_package) -> tuple[dict, dict]:
    """(the page's inputs a build and `raipack bench`/`eval` write, the package's summary)."""
    from raipack.summary import summary
    from raipack.validate import validate

    result = validate(fused_package)
    summ = summary(fused_package, result.profile)
    summ["profile_reason"] = result.profile_reason
    report = json.loads((fused_package / "report.json").read_text()) if (fused_package / "report.json").is_file() else \
        {"format": "raipack-build-report", "stages": [{"name": "fuse", "seconds": 1.0, "report": {}}], "tools": {}, "findings": []}
    bench = {"format": "raipack-bench", "format_version": 1, "package": "p", "date": "2026-12-02", "machine": {"cores": 2, "cpu": "cpu"},
             "rows": [{"backend": "reference", "ran_on": "cpu", "prompt_tokens": n, "gen_tokens": 16, "runs": 3, "peak_rss_mb": 300.0,
                       "ttft_ms": {"median": n, "min": n * 0.9, "max": n * 1.2}, "tokens_per_s": {"median": 40.0, "min": 38.0, "max": 41.0}}
                      for n in (128, 256)], "ratios": []}
    evaluation = {"results": {"t": {"acc,none": 0.5, "acc_stderr,none": 0.1}}, "configs": {}, "versions": {}, "n-shot": {},
                  "raipack": {"target": "p", "kind": "package", "ran_on": "cpu"}}
    return {"report.json": report, "bench.json": bench, "eval.json": evaluation}, summ


INPUT_KINDS = {"eval": _eval_case, "batch": _batch_case, "handover": _handover_case, "modelpackage": _modelpackage_case, "report": _report_case}


def _call(run) -> tuple[int | None, str, str]:
    """A use case called in-process under the alarm: (exit code of its RaipackError or 0, its sentence, an escaped exception)."""
    from raipack.core.errors import RaipackError

    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        run()
        return 0, "", ""
    except RaipackError as exc:
        return exc.exit_code, str(exc), ""
    except BaseException:
        return None, "", traceback.format_exc()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old_handler)


@pytest.mark.fuzz
@pytest.mark.parametrize("case", INPUT_CASES)
def test_fuzz_input(case, tmp_path, request, monkeypatch):
    kind = case.rsplit("-", 1)[0]
    rng = random.Random(case)
    root = tmp_path / "case"
    markers, outside, cwd = root / "markers", root / "outside", root / "cwd"
    for d in (markers, outside, cwd):
        d.mkdir(parents=True)
    (outside / "secret.json").write_text('{"secret": true}')
    ctx = {"markers": markers, "outside": outside, "cwd": cwd}
    fixture = {"batch": "model_folder", "handover": "handover_folder", "modelpackage": "model_package", "report": "report_inputs"}.get(kind)
    if fixture:
        ctx[fixture] = request.getfixturevalue(fixture)
    if kind == "report":
        ctx["report_inputs"], ctx["summary"] = ctx["report_inputs"]
        monkeypatch.setattr("raipack.report.plots.stage_bars", lambda stages, prefix="": "".join(str(float(s.get("seconds", 0))) for s in stages))
        monkeypatch.setattr("raipack.report.plots.against_length", lambda series, key, ylabel, prefix: str(sum(len(v) for v in series.values())))
    monkeypatch.setenv("RAIPACK_CACHE", str(root / "cache"))
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(cwd)
    applied, action, allowed = INPUT_KINDS[kind](rng, root, ctx)
    before = _snapshot(root)
    if isinstance(action, list):  # a command line
        code, output, escaped = invoke(action, cwd, {"RAIPACK_CACHE": str(root / "cache"), "NO_COLOR": "1"})
        documented = EXIT_CODES["validate"]
    else:
        code, output, escaped = _call(action)
        documented = {0, 1, 2}
    what = f"{case}: after {applied}"

    assert not escaped, f"{what}\n{escaped}"
    assert code in documented, f"{what}: exit {code}\n{output[-2000:]}"
    assert "Traceback (most recent call last)" not in output, f"{what}\n{output[-3000:]}"
    assert not any(markers.iterdir()), f"{what}: input code ran: {sorted(p.name for p in markers.iterdir())}"
    if code:
        assert output.strip(), f"{what}: exit {code} without a word"
    after = _snapshot(root)
    changed = sorted(rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)
                     and not rel.startswith("cache") and not any(rel == a or rel.startswith(a + "/") for a in allowed))
    assert not changed, f"{what}: wrote outside its output: {changed[:10]}"
