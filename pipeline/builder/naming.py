"""The name of a build's package, which the runner, its stage logs and its crash reports all use:
a module of its own, below them, so none of them imports the runner back (issue 40)."""

from __future__ import annotations

from raipack.builder.recipe import Recipe
from raipack.core.errors import UsageError
from raipack.npu.spec import Profile


def package_name(recipe: Recipe, profile: Profile) -> str:
    """AMD's pattern: <model>_rai_<release>_npu_<4K|16K> (from the profile's name pattern)."""
    patterns = profile.detect.name_patterns
    if not patterns:
        raise UsageError(f"profile {profile.id} is not a package target", "choose a release profile such as 1.8.0-npu-16K (see `raipack profiles`)")
    return patterns[0].replace("*", recipe.model_name())
