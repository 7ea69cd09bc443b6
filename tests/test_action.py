"""The GitHub Action (action.yml at the repository root), its steps run here as the runner would run them.

Each `run:` step of the composite action is run with bash in order, with GitHub's environment
(GITHUB_ACTION_PATH, GITHUB_WORKSPACE, GITHUB_OUTPUT, RUNNER_TEMP), `${{ inputs.* }}` and
`${{ steps.*.outputs.* }}` substituted as the runner substitutes them and each step's `if:` evaluated.
The two `uses:` steps are GitHub's own actions (setup-python, upload-sarif) and are not run: the test
checks what they would be given. Offline, the install step gets `--no-index --no-build-isolation
--no-deps` through the action's `pip-args` input, in a venv the test made first whose .pth names the
test environment's packages; on GitHub it installs the light raipack with its dependencies. The SARIF written is validated against
the SARIF 2.1.0 JSON schema of OASIS (tests/data/sarif-schema-2.1.0.json: oasis-tcs/sarif-spec,
sarif-2.1/schema/sarif-schema-2.1.0.json at e0583813964ec43cea53b6b531b402866095ed1f, an OASIS
standard's schema, distributed under the OASIS IPR policy).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from raipack.core import lfs

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


def _value(ref: str, inputs: dict, outputs: dict):
    kind, _, rest = ref.partition(".")
    if kind == "inputs":
        return inputs[rest]
    if kind == "steps":
        step, _, name = rest.partition(".outputs.")
        return outputs.get(step, {}).get(name, "")
    raise AssertionError(f"the test does not know the expression {ref!r}")


def _substitute(text: str, inputs: dict, outputs: dict) -> str:
    return EXPR.sub(lambda m: str(_value(m.group(1), inputs, outputs)), text)


def _condition(expr: str | None, inputs: dict, outputs: dict) -> bool:
    """The subset of GitHub's expression language action.yml uses: always(), &&, ||, ==, !=, '...' and references."""
    if not expr:
        return True
    py = expr.replace("always()", "True").replace("&&", " and ").replace("||", " or ")
    py = re.sub(r"\b(?:inputs|steps)\.[\w.-]+", lambda m: repr(_value(m.group(0), inputs, outputs)), py)
    return bool(eval(py, {"__builtins__": {}}, {"True": True}))  # our own action.yml, read as data and checked above


def _offline_venv(venv: Path) -> None:
    """The venv the install step makes, made first with a .pth naming this test environment's
    site-packages: pip then finds setuptools and wheel for the build and raipack's dependencies
    there, offline, while the raipack the step installs into the venv comes first on its path."""
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(venv)], check=True)
    [site] = list(venv.glob("lib/python*/site-packages"))
    (site / "_test_environment.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")


def read_outputs(text: str) -> dict:
    """$GITHUB_OUTPUT as the runner reads it: `name=value` lines and `name<<DELIMITER` ... `DELIMITER`
    blocks; a later value of a name replaces an earlier one."""
    out, lines = {}, iter(text.split("\n"))
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            value = []
            for body in lines:
                if body == delim:
                    break
                value.append(body)
            else:
                raise AssertionError(f"output {name!r}: no closing delimiter")
            out[name] = "\n".join(value)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


def workflow_commands(log: str) -> list[str]:
    """The workflow commands the runner would act on in a step's log: each line that starts with `::`
    (white space trimmed, to be strict) while commands are on; `::stop-commands::TOKEN` turns them
    off until a line `::TOKEN::`."""
    seen, resume = [], None
    for line in log.splitlines():
        text = line.strip()
        if resume is not None:
            if text == f"::{resume}::":
                resume = None
            continue
        if text.startswith("::"):
            seen.append(text)
            if text.startswith("::stop-commands::"):
                resume = text[len("::stop-commands::"):]
    return seen


def run_action(workspace: Path, work: Path, installed: dict | None = None, env: dict | None = None, **inputs) -> dict:
    """Run action.yml's steps; step id -> its outputs, plus the `uses:` steps' resolved `with:` under their names.
    `installed`: the outputs of an earlier run's install step, whose raipack this run reuses instead of
    building it again (each build costs about 15 s)."""
    action_dir = work / "action"
    if not action_dir.exists():
        for name in ("pipeline", "stages", "schemas"):
            shutil.copytree(ROOT / name, action_dir / name, ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md", "constraints.txt", "action.yml"):
            shutil.copy2(ROOT / name, action_dir / name)
    action = yaml.safe_load((action_dir / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    values = {k: v.get("default", "") for k, v in action["inputs"].items()}
    values.update(inputs)
    outputs, used = ({"install": installed} if installed else {}), {}
    (work / "bin").mkdir(parents=True, exist_ok=True)
    if not (work / "bin" / "python3").exists():
        os.symlink(getattr(sys, "_base_executable", sys.executable), work / "bin" / "python3")  # as setup-python would give: this one
    env_base = {"PATH": f"{work / 'bin'}{os.pathsep}{os.environ['PATH']}", "HOME": str(work), "GITHUB_ACTION_PATH": str(action_dir), "GITHUB_WORKSPACE": str(workspace),
                "RUNNER_TEMP": str(work / "runner-temp"), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1", **(env or {})}
    (work / "runner-temp").mkdir(parents=True, exist_ok=True)
    if not installed:
        _offline_venv(work / "runner-temp" / "raipack-venv")
    for step in action["runs"]["steps"]:
        if not _condition(step.get("if"), values, outputs) or (installed and step.get("id") == "install"):
            continue
        if "uses" in step:
            used[step["uses"]] = {k: _substitute(str(v), values, outputs) for k, v in step.get("with", {}).items()}
            continue
        out_file = work / f"output-{step.get('id', len(outputs))}"
        out_file.write_text("")  # a fresh file per step, as the runner gives
        env = {**env_base, "GITHUB_OUTPUT": str(out_file), **{k: _substitute(str(v), values, outputs) for k, v in step.get("env", {}).items()}}
        assert "${{" not in step["run"], "inputs reach run scripts through env only (no expression injection)"
        proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=workspace, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        outputs[step.get("id", step["name"])] = read_outputs(out_file.read_text())
        outputs[step.get("id", step["name"])]["_rc"] = proc.returncode
        outputs[step.get("id", step["name"])]["_log"] = proc.stdout  # stdout and stderr in one stream, as the job log shows them
        if proc.returncode:
            break
    outputs["_uses"] = used
    return outputs


OFFLINE = {"pip-args": "--no-index --no-build-isolation --no-deps"}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The action's install step run once (in a workspace of its own) for the tests after the first."""
    work = tmp_path_factory.mktemp("action-install")
    (work / "ws").mkdir()
    out = run_action(work / "ws", work, **{"upload-sarif": "false"}, **OFFLINE)
    assert out["install"]["_rc"] == 0, out["install"]["_log"]
    venv = work / "runner-temp" / "raipack-venv"
    assert out["install"]["raipack"] == str(venv / "bin" / "raipack")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import raipack; print(raipack.__file__)"], capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(venv)), where  # the raipack the action installed runs, not the test's
    assert out["validate"]["exit-code"] == "3"  # an empty repository: nothing to validate, and the job fails
    assert out["Fail on raipack's exit code"]["_rc"] == 3
    return work, out["install"]


@pytest.fixture
def workspace(tmp_path, make_pkg):
    ws = tmp_path / "repo"
    ws.mkdir()
    good = make_pkg("1.8.0-npu-16K")
    shutil.copytree(good, ws / "models" / good.name)
    return ws


def test_action_validates_and_writes_sarif_code_scanning_reads(workspace, installed):
    work, install = installed
    pkg = next((workspace / "models").iterdir())
    with open(pkg / "weights.extra", "wb") as fh:  # 11 MiB, sparse, in no LFS rule: RP110
        fh.truncate(11 * 2**20)
    out = run_action(workspace, work, install, paths="models", strictness="errors", **{"for": "hub"})
    assert out["validate"]["exit-code"] == "1"  # RP110 is an error --for hub
    sarif_path = workspace / out["validate"]["sarif-file"]
    sarif = json.loads(sarif_path.read_text())
    jsonschema.Draft4Validator(SCHEMA).validate(sarif)
    [result] = [r for r in sarif["runs"][0]["results"] if r["ruleId"] == "RP110"]
    assert result["level"] == "error"
    location = result["locations"][0]["physicalLocation"]["artifactLocation"]
    assert location["uri"] == f"models/{pkg.name}/weights.extra" and location["uriBaseId"] == "SRCROOT"  # relative to the repository
    assert _used(out, "github/codeql-action/upload-sarif")["sarif_file"] == "raipack.sarif"
    fail = out["Fail on raipack's exit code"]
    assert fail["_rc"] == 1 and "exited with 1" in fail["_log"]


def test_action_passes_a_clean_package_and_fails_a_bad_input(workspace, installed):
    work, install = installed
    pkg = next((workspace / "models").iterdir())
    lfs.write(pkg)
    out = run_action(workspace, work, install, paths=f"models/{pkg.name}", strictness="warnings", **{"upload-sarif": "false"})
    assert out["validate"]["exit-code"] == "0", out["validate"]["_log"]
    jsonschema.Draft4Validator(SCHEMA).validate(json.loads((workspace / "raipack.sarif").read_text()))
    assert list(out["_uses"]) == [_pinned("actions/setup-python")] and _used(out, "actions/setup-python") == {"python-version": "3.11"}
    assert out["Fail on raipack's exit code"]["_rc"] == 0
    out = run_action(workspace, work, install, strictness="loud")
    assert out["validate"]["_rc"] == 2 and "strictness is 'loud'" in out["validate"]["_log"]


# ------------------------------------------------------------------ issue 37, item 10: what a pull request can make the action do

PINS = {"actions/setup-python": ("a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0"),  # the tags of those repositories:
        "github/codeql-action/upload-sarif": ("dd903d2e4f5405488e5ef1422510ee31c8b32357", "v3.36.2")}  # v5 -> v5.6.0, v3 -> v3.36.2


def _pinned(name: str) -> str:
    return f"{name}@{PINS[name][0]}"


def _used(out: dict, name: str) -> dict:
    return out["_uses"][_pinned(name)]


def test_every_action_used_is_pinned_by_full_commit_sha_with_its_tag():
    text = (ROOT / "action.yml").read_text()
    uses = re.findall(r"^\s*uses:\s*(\S+)(.*)$", text, re.M)
    assert len(uses) == len(PINS)
    for ref, comment in uses:
        name, _, rev = ref.partition("@")
        assert re.fullmatch(r"[0-9a-f]{40}", rev), ref  # a tag (v5, v3) can be moved to other code
        assert (rev, PINS[name][1]) == PINS[name] and f"# {PINS[name][1]}" in comment, ref


def _action_env(work: Path, **extra) -> dict:
    return {"PATH": os.environ["PATH"], "HOME": str(work), "RUNNER_TEMP": str(work), "GITHUB_ACTION_PATH": str(work / "action"),
            "GITHUB_OUTPUT": str(work / "out"), **extra}


def _step(step_id: str) -> dict:
    [step] = [s for s in yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"] if s.get("id") == step_id]
    return step


def test_pip_args_are_split_into_words_never_glob_expanded(tmp_path):
    """The install step with a recording python3: pip-args `--pre *` reaches pip as those two words,
    not as the names of the files in the working folder."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\nif [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"; exit 0; fi\n'
                    'printf "%s\\n" "$@" > "$RECORD"\n')
    fake.chmod(0o755)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "planted.whl").write_text("")
    (tmp_path / "out").touch()
    env = _action_env(tmp_path, PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}", RECORD=str(tmp_path / "argv"), RAIPACK_PIP_ARGS="--pre  *\n--index-url x")
    proc = subprocess.run(["bash", "-e", "-c", _step("install")["run"]], cwd=ws, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert argv[argv.index("--pre"):] == ["--pre", "*", "--index-url", "x", "--", str(tmp_path / "action")]
    assert "planted.whl" not in argv
    assert read_outputs((tmp_path / "out").read_text()) == {"raipack": str(tmp_path / "raipack-venv" / "bin" / "raipack")}


def test_a_path_that_looks_like_an_option_is_a_path(workspace, installed):
    work, install = installed
    out = run_action(workspace, work, install, paths="--ignore=RP110 models", **{"for": "hub", "upload-sarif": "false"})
    assert out["validate"]["exit-code"] != "0", out["validate"]["_log"]  # "ok: 0 checks", exit 0 before: the path was an option
    assert "--ignore=RP110" in out["validate"]["_log"]


def test_file_names_from_the_package_never_reach_the_log_as_workflow_commands(workspace, installed):
    work, install = installed
    pkg = next((workspace / "models").iterdir())
    evil = pkg.rename(pkg.with_name("::error title=pwned::from a folder name"))
    with open(evil / "::stop-commands::x", "wb") as fh:  # 11 MiB outside LFS: RP110 names it
        fh.truncate(11 * 2**20)
    (evil / "::warning file=a.py::from a file name").write_text("")
    out = run_action(workspace, work, install, paths="models", **{"for": "hub", "upload-sarif": "false"})
    log = out["validate"]["_log"]
    assert out["validate"]["exit-code"] == "1" and "::error title=pwned::from a folder name" in log  # raipack printed them ...
    commands = workflow_commands(log)  # ... and the runner acts only on the action's own
    assert len(commands) == 1 and commands[0].startswith("::stop-commands::raipack_"), commands
    assert out["Fail on raipack's exit code"]["_rc"] == 1


def test_an_input_with_a_line_break_cannot_set_an_output(workspace, installed):
    work, install = installed
    pkg = next((workspace / "models").iterdir())
    with open(pkg / "weights.extra", "wb") as fh:
        fh.truncate(11 * 2**20)
    sarif = "report.sarif\nexit-code=0"  # a file name may hold a line break
    out = run_action(workspace, work, install, paths="models", **{"for": "hub", "upload-sarif": "false", "sarif-file": sarif})
    assert out["validate"]["exit-code"] == "1" and out["validate"]["sarif-file"] == sarif  # exit-code was overwritten with 0 before
    assert out["Fail on raipack's exit code"]["_rc"] == 1


def test_an_odd_strictness_is_escaped_in_the_error_it_prints(workspace, installed):
    work, install = installed
    out = run_action(workspace, work, install, strictness="x%0A::warning::y\n::error::z")
    assert out["validate"]["_rc"] == 2
    commands = workflow_commands(out["validate"]["_log"])
    assert commands == ["::error title=raipack::strictness is 'x%250A::warning::y%0A::error::z'; expected errors, warnings or advice"]


def test_a_hub_repository_in_paths_is_validated_by_name_with_the_hubs_exit_codes(workspace, installed, tmp_path, make_pkg):
    """Issue 38: hf://org/name in `paths`, read from a Hub stand-in on 127.0.0.1 (tests/hub_server.py); the
    token input reaches raipack as HF_TOKEN, and a repository the Hub does not have is exit 4."""
    from hub_server import FakeHub, served_repo

    work, install = installed
    pkg = make_pkg("1.8.0-npu-16K")
    with FakeHub() as hub:
        hub.repos[f"amd/{pkg.name}"] = served_repo(pkg)
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1"}
        out = run_action(workspace, work, install, env=env, paths=f"hf://amd/{pkg.name}", **{"upload-sarif": "false", "hf-token": "hf_test"})
        assert out["validate"]["exit-code"] == "0", out["validate"]["_log"]
        assert f"amd/{pkg.name}" in out["validate"]["_log"]
        missing = run_action(workspace, work, install, env=env, paths="hf://amd/nothing-here", **{"upload-sarif": "false"})
    assert missing["validate"]["exit-code"] == "4", missing["validate"]["_log"]
    assert missing["Fail on raipack's exit code"]["_rc"] == 4


def test_the_install_step_adds_the_hub_extra_only_for_hub_paths():
    step = next(s for s in yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"] if s.get("id") == "install")
    script = step["run"].split("target=", 1)[1]
    for paths, extra in (("models", False), ("models\nhf://amd/x", True), ("hf://amd/x@main", True), ("dir/hf://x", False)):
        done = subprocess.run(["bash", "-c", "GITHUB_ACTION_PATH=/a; target=" + script.split("\n")[0] + "\n" + script.split("\n")[1] + '\necho "$target"'],
                              env={"RAIPACK_PATHS": paths.replace("\\n", "\n"), "PATH": os.environ["PATH"]}, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == ("/a[hub]" if extra else "/a"), (paths, done.stdout)
