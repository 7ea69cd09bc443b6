"""`python -m raipack.cli` is `raipack`."""

from raipack.cli import main

main()
