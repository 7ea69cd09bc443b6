"""The environment raipack runs the libraries in: offline, and with their own progress bars quiet."""

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
           "QUARK_LOG_LEVEL": "warning", "TQDM_DISABLE": "1"}

# Read by OpenMP once, when torch first loads it: a build imports transformers (and so torch) to check
# its input before the quantize stage applies its own runtime settings, so the policy is set at start.
# Idle OpenMP workers then sleep instead of spinning on a core another process needs
# (docs/measurements/quantize.md: 37.9 s a layer spinning vs 9.2 s sleeping, with a busy neighbour).
THREADS = {"OMP_WAIT_POLICY": "PASSIVE"}
