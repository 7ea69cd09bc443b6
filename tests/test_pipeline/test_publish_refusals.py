"""`raipack publish` refuses before it creates anything (issue 37, items 2 and 8): a README front matter
past raipack's bounds (an alias bomb, nesting 50 000 deep; the build's licence reading too), the
files huggingface_hub's upload_folder would refuse after creating the repository (`.cache/`, held
against the installed huggingface_hub's own functions), credentials by name and tokens by content;
and a network or HTTP failure during the upload is one sentence with exit code 4. Nothing contacts
the Hub: the upload tests run `raipack publish` in a child process whose HF_ENDPOINT is a server on
127.0.0.1 started here, or a closed port."""

from __future__ import annotations

import http.server
import itertools
import json
import os
import resource
import socket
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

from helpers import run_cli
from raipack.builder.model_card import license_of
from raipack.core import frontmatter, hubpaths, lfs
from raipack.core.errors import RaipackError
from raipack.publish import IGNORED

ROOT = Path(__file__).resolve().parents[2]
LEVELS = "abcdefghi"
# the 459-byte README: nine levels of nine aliases, 9**9 = 387 420 489 strings when expanded
BOMB = "---\n" + "".join(f"{x}: &{x} [{', '.join([repr('lol')] * 9) if i == 0 else ', '.join(['*' + LEVELS[i - 1]] * 9)}]\n"
                         for i, x in enumerate(LEVELS)) + "---\n# a model\n"


def small_bomb(levels: int) -> str:
    """A bomb the code before the fix still renders (9**levels strings), to show it did."""
    names = LEVELS[:levels]
    return "---\n" + "".join(f"{x}: &{x} [{', '.join(['lol'] * 9) if i == 0 else ', '.join(['*' + names[i - 1]] * 9)}]\n"
                             for i, x in enumerate(names)) + "---\n"


def deep(n: int = 50_000, kind: str = "[") -> str:
    close = "]" if kind == "[" else "}"
    inner = "[]" if kind == "[" else "{a: 1}"
    body = ("{a: " * n + inner + close * n) if kind == "{" else ("[" * n + inner + close * n)
    return f"---\nlicense: mit\nx: {body}\n---\n# a model\n"


@pytest.fixture
def pkg(make_pkg):
    p = make_pkg("1.8.0-npu-16K")
    lfs.write(p)
    return p


def test_the_459_byte_alias_bomb_is_refused_naming_the_readme_and_the_bound(pkg):
    assert len(BOMB.encode()) < 520
    (pkg / "README.md").write_text(BOMB)
    # a child process with 1 GiB of address space and 60 s: the code before the fix ran out of both
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))}
    for extra in ([], ["--json"]):
        ran = subprocess.run([sys.executable, "-P", "-c", "import sys; from raipack.cli import main; main(sys.argv[1:])", "publish", str(pkg), "--dry-run", *extra],
                             capture_output=True, text=True, timeout=60, env=env,
                             preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30)))
        assert ran.returncode == 1, ran.stderr[-2000:]
        limit = frontmatter.limits()["max_expanded"]
        assert f"README.md's YAML front matter expands (aliases followed) to more than {limit}" in ran.stdout
        assert "Traceback" not in ran.stderr and len(ran.stdout) < 20_000
        if extra:
            doc = json.loads(ran.stdout)
            assert doc["refused"] and any(r["path"] == "README.md" for r in doc["refusals"]) and doc["card"] == {}


def test_a_bomb_the_old_code_rendered_is_refused_too(pkg, capsys):
    (pkg / "README.md").write_text(small_bomb(6))  # 531 441 strings: the old plan printed them all with --json
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run", "--json")
    assert code == 1 and len(out) < 20_000
    assert [r["path"] for r in json.loads(out)["refusals"]] == ["README.md"]


def test_a_front_matter_within_the_bounds_is_shown_with_its_aliases(pkg, capsys):
    (pkg / "README.md").write_text(small_bomb(3) + "# card\n")  # 729 strings: a card may use aliases
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run", "--json")
    assert code == 0, out
    assert len(json.loads(out)["card"]["c"]) == 9


@pytest.mark.parametrize("text", ["---\na: &a [1, *a]\n---\n", "---\na: &a {b: *a}\n---\n"])
def test_a_front_matter_that_refers_to_itself_is_refused(pkg, capsys, text):
    (pkg / "README.md").write_text(text)
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run", "--json")  # json.dumps of a loop raised ValueError
    assert code == 1 and "refers to itself" in out


def test_odd_front_matter_values_print_as_json(pkg, capsys):
    (pkg / "README.md").write_text("---\n2024-01-01: date key\nx: .nan\ny: -.inf\n---\n")
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run", "--json")
    assert code == 0, out
    card = json.loads(out)["card"]  # strict JSON: no NaN, no date keys (a TypeError traceback before)
    assert card == {"2024-01-01": "date key", "x": "nan", "y": "-inf"}


@pytest.mark.parametrize("kind", ["[", "{"])
def test_front_matter_nested_50_000_deep_is_one_sentence_in_publish(pkg, capsys, kind):
    (pkg / "README.md").write_text(deep(kind=kind))
    code, out, err = run_cli(capsys, "publish", pkg, "--dry-run")
    assert code == 1 and "Traceback" not in err
    assert f"README.md's YAML front matter is nested more than {frontmatter.limits()['max_depth']} deep" in out


def test_front_matter_nested_50_000_deep_in_the_build_s_licence_reading(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "README.md").write_text(deep())
    with pytest.raises(RaipackError) as info:  # RecursionError before
        license_of(source)
    assert str(source / "README.md") in str(info.value) and "nested more than" in str(info.value)
    (source / "README.md").write_text("---\nlicense: apache-2.0\n---\n")
    assert license_of(source) == "apache-2.0"


# ------------------------------------------------------------------------- what the client refuses


def test_an_amd_1_6_package_with_a_cache_folder_is_refused_before_any_request(make_pkg, capsys, monkeypatch):
    pkg = make_pkg("1.6-npu")
    lfs.write(pkg)
    assert any(p.parent.name == ".cache" for p in pkg.rglob("*.const"))
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run")
    assert code == 1 and "The Hub would take every file" not in out
    assert ".cache/: the Hub's client refuses its" in out and "git-lfs" in out
    calls = []
    api = type("Api", (), {"__init__": lambda self, token=None: None,
                           "create_repo": lambda self, *a, **k: calls.append("create_repo"),
                           "upload_folder": lambda self, **k: calls.append("upload_folder")})
    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(HfApi=api, get_token=lambda: "t"))
    code, out, _ = run_cli(capsys, "publish", pkg, "--repo", "me/pkg")
    assert code == 1 and calls == []  # before: the repository was created, then upload_folder raised ValueError


PARTS = ["a", ".git", ".cache", "huggingface", "x.bin", "..", ".gitattributes", "cache", ".cachex", "sub"]


def _client_view(rel: str) -> str:
    """What the installed huggingface_hub does with `rel` in upload_folder: its filter, then its check."""
    from huggingface_hub import _commit_api
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

    if not list(filter_repo_objects([rel], ignore_patterns=list(IGNORED) + DEFAULT_IGNORE_PATTERNS)):
        return "ignored"
    try:
        _commit_api._validate_path_in_repo(rel)
    except ValueError:
        return "refused"
    return "taken"


def test_raipack_s_client_rules_agree_with_the_installed_huggingface_hub():
    pytest.importorskip("huggingface_hub", reason="the hub extra is not installed")
    seen = {"ignored": 0, "refused": 0, "taken": 0}
    for n in (1, 2, 3, 4):
        for parts in itertools.product(PARTS, repeat=n):
            rel = "/".join(parts)
            theirs = _client_view(rel)
            ours = "ignored" if hubpaths.client_ignores(rel, IGNORED) else "refused" if hubpaths.client_refuses(rel) else "taken"
            assert ours == theirs, rel
            seen[theirs] += 1
    assert all(seen.values()), seen  # every outcome was exercised


# ------------------------------------------------------------------------- secrets


@pytest.mark.parametrize("rel", [".env", ".netrc", ".huggingface/token", "sub/.env.local", "keys/id_ed25519", ".git-credentials"])
def test_credentials_files_are_refused_by_name(pkg, capsys, rel):
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_text("machine x login y password z\n")
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run")
    assert code == 1 and f"{rel}: raipack refuses it: its name is that of a credentials file" in out


def test_a_token_in_a_small_text_file_is_refused_and_never_printed(pkg, capsys):
    token = "hf_" + "Ab3" * 11 + "x"
    (pkg / "notes.txt").write_text(f"use HF_TOKEN={token} to download\n")
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run", "--json")
    assert code == 1 and token not in out
    assert {"path": "notes.txt", "reason": "raipack refuses it: it holds what looks like a Hugging Face token",
            "hint": "remove the secret from the file (and revoke it if it is real), then publish again"} in json.loads(out)["refusals"]
    (pkg / "notes.txt").write_text("the tokenizer maps hf_short and hf_ to ids\n")  # not token-shaped
    code, out, _ = run_cli(capsys, "publish", pkg, "--dry-run")
    assert code == 0, out


# ------------------------------------------------------------------------- the network


class _Answering(http.server.BaseHTTPRequestHandler):
    status = 401

    def _answer(self):
        if self.status == "create-only":  # the repository is created, every later request is refused (a 5xx is retried for 25 s)
            status, doc = (200, {"url": "http://127.0.0.1/me/pkg", "name": "me/pkg"}) if self.path.startswith("/api/repos/create") else (400, {"error": "refused"})
        else:
            status, doc = self.status, {"error": "an answer of the Hub stand-in"}
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def hub_server(request):
    handler = type("Handler", (_Answering,), {"status": request.param})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # bound then closed: nothing listens there


def _publish_child(pkg: Path, endpoint: str, tmp_path: Path) -> subprocess.CompletedProcess:
    pytest.importorskip("huggingface_hub", reason="the hub extra is not installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE", "TRANSFORMERS_"))}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN="hf_" + "x" * 34, HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1",
               NO_PROXY="*", no_proxy="*", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")])))
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        env.pop(proxy, None)
    return subprocess.run([sys.executable, "-P", "-c", "import sys; from raipack.cli import main; main(sys.argv[1:])", "publish", str(pkg), "--repo", "me/pkg"],
                          capture_output=True, text=True, timeout=120, env=env)


def test_no_network_is_one_sentence_and_exit_code_5(pkg, tmp_path):
    ran = _publish_child(pkg, _closed_port(), tmp_path)
    assert ran.returncode == 5, ran.stderr[-3000:]
    assert "Uploading." in ran.stdout and "Traceback" not in ran.stderr
    [line] = [x for x in ran.stderr.splitlines() if x.startswith("ERROR:")]
    assert f"publishing {pkg} to me/pkg failed while creating the repository" in line and "Connect" in line


@pytest.mark.parametrize("hub_server, code, said", [(401, 4, "the Hub refused publishing"), (403, 4, "(HTTP 403)"), (500, 5, "failed while creating the repository"),
                                                   ("create-only", 4, "while uploading the files (HTTP 400)")],
                         indirect=["hub_server"])
def test_an_http_error_from_the_hub_is_one_sentence_and_its_exit_code(pkg, tmp_path, hub_server, code, said):
    ran = _publish_child(pkg, hub_server, tmp_path)
    assert ran.returncode == code, ran.stderr[-3000:]
    assert "Traceback" not in ran.stderr and said in ran.stderr
    assert len([x for x in ran.stderr.splitlines() if x.startswith("ERROR:")]) == 1
