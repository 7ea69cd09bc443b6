"""The environment raipack runs the libraries in: offline, and with their own progress bars quiet."""

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false",
           "QUARK_LOG_LEVEL": "warning", "TQDM_DISABLE": "1"}
