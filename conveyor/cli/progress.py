"""Progress of long CLI commands: a bar for people, one JSON line for programs.

A command that may run for minutes (``enqueue --batch`` on a large file,
``migrate`` on a big database) shows a rich progress bar on stderr while it
works, but only when stderr is a terminal: piped into a file, a CI log or
another program, it draws nothing, so the output stays what a program can
read. It ends with one summary line on its summary stream: a sentence when
that stream is a terminal, else one JSON object (``{"command": ..., "ok":
..., ..., "seconds": ...}``) on one line.

While the bar is shown, conveyor's JSON log lines are printed above it
rather than through it (they go to the stream the bar lives on).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


class CommandProgress:
    """One command's bars and its summary line.

    ``with CommandProgress("migrate", summary_stream=sys.stdout) as p:``, then
    ``task = p.add("applying", total=n)``, ``p.advance(task, 1, "0042_builds.sql")``
    and finally ``p.summary("applied 2 migration(s)", applied=[...])``.
    """

    def __init__(self, command: str, *, summary_stream: TextIO | None = None, bar_stream: TextIO | None = None) -> None:
        self.command = command
        self.bar_stream = bar_stream or sys.stderr
        self.summary_stream = summary_stream or sys.stderr
        self.interactive = is_terminal(self.bar_stream)
        self.started = time.monotonic()
        self._progress: Progress | None = None
        self._handlers: list[tuple[logging.StreamHandler[Any], TextIO | None]] = []

    def __enter__(self) -> CommandProgress:
        if self.interactive:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TaskProgressColumn,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.bar_stream),
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._progress = progress
            progress.start()
            self._route_logs_above_the_bar(progress.console)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()
            for handler, stream in self._handlers:
                handler.setStream(stream)
            self._handlers.clear()

    def add(self, description: str, total: float | None) -> TaskID | None:
        """A new bar (``total=None``: a bar of unknown length). Nothing is drawn off a terminal."""
        if self._progress is None:
            return None
        return self._progress.add_task(description, total=total)

    def advance(self, task: TaskID | None, amount: float = 1, description: str | None = None) -> None:
        if self._progress is None or task is None:
            return
        if description is None:
            self._progress.advance(task, amount)
        else:
            self._progress.update(task, advance=amount, description=description)

    def finish(self, task: TaskID | None, total: float | None = None) -> None:
        """Mark a bar done (a bar of unknown length gets its length now)."""
        if self._progress is None or task is None:
            return
        done = self._progress.tasks[task].completed if total is None else total
        self._progress.update(task, total=done, completed=done)

    def summary(self, text: str, *, ok: bool = True, **fields: Any) -> None:
        """The command's last line: ``text`` on a terminal, else a JSON object of ``fields``."""
        seconds = round(time.monotonic() - self.started, 3)
        if self._progress is not None:
            self.__exit__(None, None, None)
            self._progress = None
        if is_terminal(self.summary_stream):
            from rich.console import Console

            Console(file=self.summary_stream, highlight=False).print(
                f"{text} in {seconds:.1f} s", markup=False, soft_wrap=True
            )
        else:
            line = json.dumps({"command": self.command, "ok": ok, **fields, "seconds": seconds})
            print(line, file=self.summary_stream, flush=True)

    def _route_logs_above_the_bar(self, console: Console) -> None:
        from rich.file_proxy import FileProxy

        proxy = FileProxy(console, self.bar_stream)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is self.bar_stream:
                self._handlers.append((handler, handler.setStream(proxy)))
