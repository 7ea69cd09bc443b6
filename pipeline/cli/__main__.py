"""`python -m pipeline.cli` is `raipack`."""

from pipeline.cli import main

main()
