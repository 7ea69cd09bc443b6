"""Which checks a validation runs, and how deep it reads: the options `raipack validate` passes down to every
package it checks (pipeline/validate.py) and to every variant of a model package (pipeline/modelpackage/check.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Selection:
    select: tuple[str, ...] = ()  # only these check ids or prefixes (empty: all)
    ignore: tuple[str, ...] = ()  # skip these check ids or prefixes
    verify_hashes: bool = False  # hash every file against manifest.json or its Git LFS oid
    platform: str | None = None  # "linux": also AMD's Linux deployment steps (RP407)
    revision: str | None = None  # a Hugging Face cache's or Hub repository's branch, tag or commit (pipeline/places/)

    def as_options(self) -> dict:
        """The keywords pipeline/validate.py: validate takes for this selection."""
        return {"select": tuple(self.select), "ignore": tuple(self.ignore), "verify_hashes": self.verify_hashes, "platform": self.platform}
