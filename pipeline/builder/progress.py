"""Progress the way users expect: a line per stage, bars for long steps.

Three modes: `rich` (a terminal: bars and colours, honours NO_COLOR), `plain`
(not a terminal: a line per stage, and for a step that has run a while a
line at a quarter, half and three quarters of it), `json` (JSON
lines on stderr, for CI logs); `quiet` prints only errors and the summary.
While a stage runs, its libraries' output goes to the stage's log.txt
(raipack.builder.logs) and these lines keep going to the terminal; `verbose`
shows the libraries' output live as well.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager


class Progress:
    def __init__(self, mode: str = "auto", stream=None, verbose: bool = False):
        self.stream = stream or sys.stderr
        self.verbose = verbose
        self._logs: dict[str, str] = {}
        if mode == "auto":
            mode = "rich" if getattr(self.stream, "isatty", lambda: False)() else "plain"
        self.mode = mode
        self._console = None
        self._bar = None
        if mode == "rich":
            from rich.console import Console

            self._console = Console(file=self.stream)

    @contextmanager
    def writing_to(self, stream):
        """Write to `stream` for a while if this writes to fd 2, which is then redirected to a log."""
        if _fileno(self.stream) != 2:
            yield
            return
        old = self.stream
        self.stream = stream
        if self._console:
            self._console.file = stream
        try:
            yield
        finally:
            self.stream = old
            if self._console:
                self._console.file = old

    def logged(self, stage: str, path: str):
        """The libraries said something while `stage` ran: its stage line names the file."""
        self._logs[stage] = path

    # -- events ----------------------------------------------------------
    def event(self, kind: str, **fields):
        if self.mode == "json":
            self.stream.write(json.dumps({"event": kind, "time": round(time.time(), 3), **fields}) + "\n")
            self.stream.flush()

    def line(self, text: str, style: str = ""):
        if self.mode == "quiet" or self.mode == "json":
            return
        if self._console:
            self._console.print(text, style=style or None, highlight=False)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def stage(self, name: str, status: str, seconds: float, detail: str = ""):
        self.close_bars()
        log = self._logs.pop(name, None)
        self.event("stage", stage=name, status=status, seconds=round(seconds, 2), detail=detail, **({"log": log} if log else {}))
        if log:
            detail = f"{detail} · log: {log}" if detail else f"log: {log}"
        mark = {"built": "✔", "cached": "✔", "failed": "✘", "skipped": "·"}.get(status, "•")
        style = {"failed": "red", "cached": "dim"}.get(status, "")
        self.line(f"{mark} {name:9} {status:7} {seconds:7.1f} s  {detail}".rstrip(), style)

    @contextmanager
    def task(self, description: str, total: int | None = None):
        """Yield `advance(n=1)` for a long step; draws a bar when it can."""
        start = time.perf_counter()
        self.event("task", task=description, total=total, state="start")
        if self.mode == "rich" and total:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            with Bar(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self._console, transient=True, **_NO_REDIRECT) as bar:
                tid = bar.add_task(description, total=total)
                yield lambda n=1: bar.advance(tid, n)
        else:
            done = [0]
            marks = _Milestones()

            def advance(n=1):
                done[0] += n
                if self.mode == "plain" and marks.due(done[0], total):
                    self.line(f"  {description}: {done[0]}/{total} ({marks.seconds():.0f} s)")
                self.event("task", task=description, done=done[0], total=total)

            yield advance
        self.event("task", task=description, state="end", seconds=round(time.perf_counter() - start, 2))

    def callback(self, description: str):
        """A `(what, done, total)` callback for stage code that reports its own
        steps (calibration batches, AWQ layers, files written)."""
        tasks: dict[str, int] = {}
        marks: dict[str, _Milestones] = {}

        def report(what: str, done: int, total: int):
            self.event("task", task=f"{description}: {what}", done=done, total=total)
            if self.mode == "rich":
                if self._bar is None:
                    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
                    from rich.progress import Progress as Bar

                    self._bar = Bar(TextColumn("  {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=self._console, transient=True, **_NO_REDIRECT)
                    self._bar.start()
                if what not in tasks:
                    tasks[what] = self._bar.add_task(f"{description}: {what}", total=total)
                self._bar.update(tasks[what], completed=done, total=total)
            elif self.mode == "plain" and marks.setdefault(what, _Milestones()).due(done, total):
                self.line(f"  {description}: {what} {done}/{total} ({marks[what].seconds():.0f} s)")

        return report

    def close_bars(self):
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


PLAIN_AFTER_SECONDS = 10.0  # plain mode: a step shorter than this prints no line of its own (its stage line follows)


class _Milestones:
    """When a step in plain mode prints: at 1/4, 1/2 and 3/4 of it, once it has run PLAIN_AFTER_SECONDS.
    No line at the end (the stage line follows), at most three per step: a CI log stays short."""

    def __init__(self):
        self._start = time.perf_counter()
        self._shown = 0

    def seconds(self) -> float:
        return time.perf_counter() - self._start

    def due(self, done: int, total: int | None) -> bool:
        quarter = min(done * 4 // total, 3) if total else 0
        if quarter > self._shown and self.seconds() >= PLAIN_AFTER_SECONDS:
            self._shown = quarter
            return True
        return False


_NO_REDIRECT = {"redirect_stdout": False, "redirect_stderr": False}  # a library's print belongs in the stage log, not above the bar


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, ValueError, OSError):
        return None
