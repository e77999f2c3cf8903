"""Progress bars and tables for the command line, drawn by rich.

On a terminal a bar redraws in place; elsewhere (a log, a pipe, CI) each bar prints one plain
line when a phase starts and when it completes, so logs stay readable.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table


class _Bar:
    """One rich `Progress` on a terminal, plain lines elsewhere; a task per phase."""

    def __init__(self, label: str, stream: TextIO | None, columns: Sequence[ProgressColumn]):
        self.label = label
        self.console = Console(file=stream if stream is not None else sys.stderr)
        self._columns = columns
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._phase: str | None = None

    @property
    def tty(self) -> bool:
        return self.console.is_terminal

    def _update(self, phase: str, done: int, total: int, line: str) -> None:
        new_phase = phase != self._phase
        self._phase = phase
        if not self.tty:
            if new_phase or (total > 0 and done >= total):
                self.console.file.write(line + "\n")
                self.console.file.flush()
            return
        if self._progress is None:
            self._progress = Progress(*self._columns, console=self.console)
            self._progress.start()
        if new_phase or self._task is None:
            if self._task is not None:
                self._progress.stop_task(self._task)
            self._task = self._progress.add_task(f"{self.label} {phase}", total=total or None)
        self._progress.update(self._task, completed=done, total=total or None)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        self._task = None


class ProgressBar(_Bar):
    """A progress callback for `models.pull`: `name phase [bar] 12.3/98.4 MB 13%`."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        super().__init__(
            label,
            stream,
            (
                TextColumn("{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TaskProgressColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
            ),
        )

    def __call__(self, phase: str, done: int, total: int) -> None:
        frac = min(done / total, 1.0) if total > 0 else 0.0
        line = f"{self.label} {phase:<8} {done / 1e6:7.1f}/{total / 1e6:.1f} MB {frac * 100:3.0f}%"
        self._update(phase, done, total, line)


class StepBar(_Bar):
    """A progress callback for `tune.tune_model`: `label [bar] 3/7 what`."""

    def __init__(self, label: str, stream: TextIO | None = None) -> None:
        super().__init__(
            label, stream, (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
        )

    def __call__(self, what: str, done: int, total: int) -> None:
        self._update(what, done, total, f"{self.label} {done}/{total} {what}")


def render_table(head: Sequence[str], rows: Sequence[Sequence[str]], *, numeric_from: int) -> str:
    """A plain-text table (no colour; a rule under the header): columns from `numeric_from` on
    align right."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="")
    for i, name in enumerate(head):
        table.add_column(name, justify="right" if i >= numeric_from else "left", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = Console(width=10_000, no_color=True, highlight=False, force_terminal=False)
    with console.capture() as cap:
        console.print(table)
    return "\n".join(line.rstrip() for line in cap.get().splitlines())
