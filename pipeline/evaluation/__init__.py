"""`raipack eval`: lm-eval-harness over each thing a build produces (docs/eval.md).

- targets.py: what a folder is (source, quark, export, package);
- backends.py: the runtime each kind runs on, giving the logits of every continuation position;
- lm.py: the lm-eval `LM` over a backend;
- tasks.py: a local task folder checked, copied into a folder raipack owns, and lm-eval run there;
- chain.py: the same tasks on every stage of a build, the drops, and the build gate.
"""
