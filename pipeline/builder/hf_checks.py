"""The build's input check through the libraries the build will use, before any stage runs.

config.json goes through transformers' own config class, the tokenizer is loaded with
transformers, and the chat template is rendered once in transformers' Jinja sandbox, as
the quantize stage's quality probe will: what those libraries would refuse minutes into
the build with a traceback is refused here with one sentence (UsageError, exit 2). None of
it runs code from the folder: remote code is never trusted here, a config is a JSON read,
a tokenizer is parsed by the Rust `tokenizers` library, a template runs in the sandbox.

transformers is imported here only (2-5 s, the build imports it anyway); `raipack
validate` never imports this module. The chat template's static check needs jinja2 only.
"""

from __future__ import annotations

import re
from pathlib import Path

from raipack.builder.model_files import FIX_CONFIG, FIX_GENERATION, FIX_TEMPLATE, FIX_TOKENIZER, short
from raipack.core.errors import UsageError

SAMPLE_CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:200] if lines else type(exc).__name__


def check_config_class(cfg_path: Path, cfg: dict) -> None:
    """Build transformers' config object from the parsed config.json (no model code runs);
    a field its strict dataclass refuses becomes one sentence naming that field."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = cfg.get("model_type")
    if model_type not in CONFIG_MAPPING:
        raise UsageError(f"{cfg_path}: model_type is {short(model_type)}, which transformers does not know", FIX_CONFIG)
    try:
        CONFIG_MAPPING[model_type].from_dict(dict(cfg))
    except Exception as exc:  # the config class's validation: strict dataclass errors, ValueError, TypeError...
        detail = str(exc)
        field = re.search(r"field '([^']+)'", detail)
        cause = (detail.splitlines()[1:2] or [detail])[0].strip().removeprefix("TypeError: ").removeprefix("ValueError: ")
        if field:
            raise UsageError(f"{cfg_path}: {field[1]} is refused by transformers' {model_type} config: {cause[:160]}", FIX_CONFIG) from None
        raise UsageError(f"{cfg_path} is refused by transformers' {model_type} config: {type(exc).__name__}: {_first_line(exc)}", FIX_CONFIG) from None


def check_generation_config(gen_path: Path, gen: dict) -> None:
    """Build transformers' GenerationConfig from the parsed generation_config.json, as loading the model will."""
    from transformers import GenerationConfig

    try:
        GenerationConfig.from_dict(dict(gen))
    except Exception as exc:
        raise UsageError(f"{gen_path} is refused by transformers' GenerationConfig: {type(exc).__name__}: {_first_line(exc)}", FIX_GENERATION) from None


def template_problem(source: str) -> str | None:
    """What is wrong with a chat template, read without running it: a syntax error, or a
    read of an underscore attribute (`__class__`, `__globals__`: the way out of Jinja's sandbox)."""
    import jinja2
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        tree = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateSyntaxError as exc:
        return f"is not a valid Jinja template: {exc.message} at line {exc.lineno}"
    except (RecursionError, MemoryError):
        return "is nested too deeply to parse"
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Filter)):
        if isinstance(node, nodes.Getattr):
            name = node.attr
        elif isinstance(node, nodes.Getitem):
            name = node.arg.value if isinstance(node.arg, nodes.Const) else None
        else:
            name = node.args[0].value if node.name == "attr" and node.args and isinstance(node.args[0], nodes.Const) else None
        if isinstance(name, str) and name.startswith("_"):
            return f"reads the private attribute {short(name, 40)} at line {node.lineno}, which only a template trying to leave Jinja's sandbox does"
    return None


def check_tokenizer_json(tok_path: Path, text: str) -> None:
    """Parse tokenizer.json with the Rust tokenizers library (data only, no code)."""
    from tokenizers import Tokenizer

    try:
        Tokenizer.from_str(text)
    except BaseException as exc:
        _reraise_if_not_an_error(exc)
        raise UsageError(f"{tok_path} cannot be read by the tokenizers library: {_first_line(exc)}", FIX_TOKENIZER) from None


def check_tokenizer_loads(path: Path, template_where: str | None) -> None:
    """Load the tokenizer as the quantize stage will (remote code never trusted) and render the
    chat template once in transformers' sandbox; a failure is one sentence naming the files."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False, local_files_only=True)
    except BaseException as exc:  # whatever transformers or tokenizers refuse in these files
        _reraise_if_not_an_error(exc)
        raise UsageError(f"{path}: the tokenizer (tokenizer_config.json, tokenizer.json) cannot be loaded: {type(exc).__name__}: {_first_line(exc)}",
                         FIX_TOKENIZER) from None
    if not getattr(tok, "chat_template", None):
        return
    try:
        tok.apply_chat_template(SAMPLE_CHAT, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # jinja2's SecurityError, TemplateError, the sandbox's range limit...
        raise UsageError(f"{template_where or path / 'tokenizer_config.json'} fails in transformers' sandbox: {type(exc).__name__}: {_first_line(exc)}",
                         FIX_TEMPLATE) from None


def _reraise_if_not_an_error(exc: BaseException) -> None:
    """Ctrl-C and exit pass through; a Rust panic in tokenizers (PanicException, a BaseException) is an error of the input."""
    if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
        raise exc
