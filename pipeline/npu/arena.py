"""The arena of a dd_metastate plan (pipeline/npu/plans.py): which activations and node scratches
live from which step to which, which of them are alive together, and offsets that never let two
live buffers share bytes (greedy first fit by decreasing size). Standard library only."""

from __future__ import annotations

from raipack.npu.formats import PLAN_ALIGNMENT, align


def activation_buffers(steps: list, tensors: dict, io: dict) -> list[dict]:
    """Every activation (from the step that writes it to the last step that reads it; graph inputs
    from step 0, logits to the end) and every node scratch (its own step), in a fixed order."""
    kv_names = {n for pair in io["past"] + io["present"] for n in pair}
    first = {n: 0 for n in (io["input_ids"], io["attention_mask"]) if n}
    last: dict[str, int] = {io["logits"]: len(steps) + 1}
    out = []
    for k, s in enumerate(steps, start=1):
        for o in s["outputs"]:
            first.setdefault(o, k)
        for i in s["inputs"]:
            last[i] = max(last.get(i, 0), k)
        if "scratch" in s:
            out.append({"name": f"{s['node']}/scratch", "first_step": k, "last_step": k})
    out += [{"name": n, "first_step": first[n], "last_step": max(last.get(n, first[n]), first[n])}
            for n in tensors if n in first and n not in kv_names]
    return sorted(out, key=lambda b: (b["first_step"], b["last_step"], b["name"]))


def live_pairs(first: list[int], last: list[int]) -> list[tuple[int, int]]:
    """Index pairs of the intervals [first, last] that intersect (a sweep in order of first)."""
    active: list[int] = []
    pairs = []
    for i in sorted(range(len(first)), key=first.__getitem__):
        active = [j for j in active if last[j] >= first[i]]
        pairs += [(j, i) for j in active]
        active.append(i)
    return pairs


def first_fit(sizes: list[int], order: list[int], neighbors: list[list[int]], alignment: int) -> list[int]:
    """Offsets by first fit in `order`: a buffer never shares bytes with a placed neighbor."""
    offsets: list = [None] * len(sizes)
    for i in order:
        busy = sorted((offsets[j], offsets[j] + sizes[j]) for j in neighbors[i] if offsets[j] is not None)
        off = 0
        for s, e in busy:
            if off + sizes[i] <= s:
                break
            off = max(off, align(e, alignment))
        offsets[i] = off
    return offsets


def assign_offsets(buffers: list[dict], alignment: int = PLAN_ALIGNMENT) -> int:
    """Greedy first fit by decreasing size: sets `offset` on every buffer so that buffers whose
    [first_step, last_step] intervals intersect never share bytes. Returns the arena size."""
    first, last = [b["first_step"] for b in buffers], [b["last_step"] for b in buffers]
    neighbors: list[list[int]] = [[] for _ in buffers]
    for i, j in live_pairs(first, last):
        neighbors[i].append(j)
        neighbors[j].append(i)
    sizes = [b["size"] for b in buffers]
    order = sorted(range(len(buffers)), key=lambda i: (-sizes[i], first[i], buffers[i]["name"]))
    for b, off in zip(buffers, first_fit(sizes, order, neighbors, alignment)):
        b["offset"] = off
    return align(max((b["offset"] + b["size"] for b in buffers), default=0), alignment)
