"""Errors whose str() is the one sentence a user reads; the CLI adds the hint."""


class RaipackError(Exception):
    """A user-facing error: bad input, bad option, missing file.

    `str(err)` names the file, the field and what was expected; `hint` says
    what to do next. The CLI prints both and exits with `exit_code`.
    """

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint


class UsageError(RaipackError):
    """A wrong command line or option value (exit code 2)."""

    exit_code = 2


class NothingToValidate(RaipackError):
    """The path holds nothing raipack recognises as a package (exit code 3)."""

    exit_code = 3
