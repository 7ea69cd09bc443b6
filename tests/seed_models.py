"""Tiny stand-ins for the seed model families (tests/data/seeds.json).

Each has the real family's config shape — architecture, rope settings, vocabulary, tied or
untied head, head-count ratio — at 2 layers and a few hundred hidden units, a byte-level BPE
tokenizer trained on the bundled calibration text, and weights trained for a few dozen steps so
greedy decoding is not a coin toss between near-equal logits. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

SEEDS = json.loads((Path(__file__).parent / "data" / "seeds.json").read_text())
MORE = json.loads((Path(__file__).parent / "data" / "families.json").read_text())  # issue 14's families
FAMILIES = {**SEEDS["families"], **MORE["families"]}
PACKAGES = SEEDS["packages"]  # the five seed packages
FAMILY_PACKAGES = MORE["packages"]  # one AMD folder name per issue-14 family and profile

PHI_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def tiny_config(family: str) -> dict:
    """The family's config with the tiny dimensions applied (everything else real)."""
    spec = FAMILIES[family]
    return {**spec["config"], **spec["tiny"]}


def make_tiny_model(family: str, out_dir: Path, *, train_steps: int = 60, seed: int = 0) -> Path:
    from tiers import refuse_in_quick_tier

    refuse_in_quick_tier(f"make_tiny_model({family!r}) (tests/seed_models.py)")
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from shared_fixtures import TRAIN_TEXT, train_bpe_tokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_bpe_tokenizer(out_dir)
    fields = tiny_config(family)
    fields.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    model_type = fields.pop("model_type")
    fields.pop("architectures")
    fields.pop("torch_dtype", None)
    cfg = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    ids = torch.tensor(tok(TRAIN_TEXT)["input_ids"])
    used = len(tok)  # train the head rows the tokenizer can produce: a 128256-row head costs 250× more
    emb = model.get_input_embeddings()
    full_emb, full_head = emb.weight, model.get_output_embeddings().weight
    tied = full_head is full_emb
    # Train on the used rows only: AdamW on the whole 128K-row embedding and head (zero gradients but a
    # full update each step) took 25 of a seed model's 35 s. The module stays (Gemma scales its embedding).
    emb.weight = torch.nn.Parameter(full_emb.detach()[:used].clone())
    head = emb.weight if tied else torch.nn.Parameter(full_head.detach()[:used].clone())
    trained = [p for p in model.parameters() if p is not full_emb and p is not full_head] + ([] if tied else [head])
    opt = torch.optim.AdamW(trained, lr=3e-3)
    model.train()
    for _ in range(train_steps):
        starts = torch.randint(0, ids.numel() - 65, (8,))
        batch = torch.stack([ids[s: s + 65] for s in starts.tolist()])
        hidden = model.model(input_ids=batch[:, :-1]).last_hidden_state
        logits = hidden @ head.T
        torch.nn.functional.cross_entropy(logits.reshape(-1, used), batch[:, 1:].reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        full_emb[:used] = emb.weight
        if not tied:
            full_head[:used] = head
        full_head[used:].mul_(0.1)  # rows no token reaches stay far below the trained ones
    emb.weight = full_emb
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, do_sample=False).save_pretrained(out_dir)
    _published_rope_form(out_dir / "config.json", FAMILIES[family]["config"])
    return out_dir


def _published_rope_form(path: Path, real: dict) -> None:
    """transformers 5 saves `rope_parameters`; the published checkpoints carry `rope_theta` and
    `rope_scaling`, which is what users' folders hold, so the test models do too."""
    doc = json.loads(path.read_text())
    doc.pop("rope_parameters", None)
    doc["rope_theta"] = real["rope_theta"]
    doc["rope_scaling"] = real["rope_scaling"]
    if "rope_local_base_freq" in real:  # Gemma 3: the sliding layers' own rope base
        doc["rope_local_base_freq"] = real["rope_local_base_freq"]
    path.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":  # python tests/seed_models.py FAMILY OUT_DIR (with raipack installed)
    import sys

    print(make_tiny_model(sys.argv[1], Path(sys.argv[2])))
