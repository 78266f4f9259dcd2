"""Quiet command output: library chatter to a log file, one progress bar per stage on the terminal.

:func:`quiet_output` sends everything written to the process's stdout and stderr to a log file,
at the file-descriptor level, so that C++ warnings of Ray's core, tqdm bars of Hugging Face, Python
warnings and log records of every library land there, as does the output of any process started
meanwhile (a local Ray's own processes). The terminal gets only what the caller prints through the
console it yields. :func:`stage_bars` draws one bar per stage of a pipeline on that console.

Example::

    with quiet_output("runs/x/run.log") as console, stage_bars(console) as stage:
        with stage("preprocess") as step:
            do_work()
            step()
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import IO, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

# Set while quiet: Hugging Face and tokenizers read them when they start, Ray's processes inherit them.
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class Stage(Protocol):
    """``stage(name, total)``: a context whose value advances the stage's bar by one step."""

    def __call__(self, name: str, total: int = 1) -> AbstractContextManager[Callable[[], None]]: ...


@contextlib.contextmanager
def logged_stage(name: str, total: int = 1) -> Iterator[Callable[[], None]]:
    """A :class:`Stage` that only logs: what library callers of a pipeline get by default."""
    logging.getLogger("toolscout").info("stage: %s", name)
    yield lambda: None


def _terminal(stream: IO[str]) -> tuple[IO[str], IO[str] | None]:
    """A stream that still reaches where ``stream`` goes once fds 1 and 2 point at the log.

    A real stdout/stderr gets a duplicate of its descriptor (returned second, to close); anything
    else (a test runner's capture buffer) is used as it is.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return stream, None
    if fd not in (1, 2):
        return stream, None
    dup = os.fdopen(os.dup(fd), "w", buffering=1, encoding=getattr(stream, "encoding", None) or "utf-8")
    return dup, dup


def quiet_libraries() -> None:
    """Hugging Face's progress bars and advisory warnings off in this process (already imported)."""
    with contextlib.suppress(ImportError):
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    with contextlib.suppress(ImportError):
        import huggingface_hub.utils

        huggingface_hub.utils.disable_progress_bars()


@contextlib.contextmanager
def quiet_output(log_path: str) -> Iterator[Console]:
    """Send stdout, stderr and log records (INFO and up) to ``log_path``; yield a terminal console.

    The file is appended to. Everything is put back on exit, also when the body raises, in which
    case the console says where the log is before the exception goes on.
    """
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    width = shutil.get_terminal_size().columns
    terminal, dup = _terminal(sys.stdout)
    console = Console(file=terminal, width=width if dup else None)
    log_file = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed in finally)
    saved_env = {k: os.environ.get(k) for k in QUIET_ENV}
    os.environ.update(QUIET_ENV)
    saved_streams = sys.stdout, sys.stderr
    for s in saved_streams:
        with contextlib.suppress(Exception):
            s.flush()
    saved_fds = {fd: os.dup(fd) for fd in (1, 2)}
    root = logging.getLogger()
    handler = logging.StreamHandler(log_file)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    saved_level = root.level
    failed = False
    try:
        for fd in (1, 2):
            os.dup2(log_file.fileno(), fd)
        sys.stdout = sys.stderr = log_file
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        logging.captureWarnings(True)
        quiet_libraries()
        yield console
    except BaseException:
        failed = True
        raise
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        root.setLevel(saved_level)
        log_file.flush()
        sys.stdout, sys.stderr = saved_streams
        for fd, saved in saved_fds.items():
            os.dup2(saved, fd)
            os.close(saved)
        log_file.close()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if failed:
            console.print(f"[red]failed[/]; full log: {log_path}")
        if dup is not None:
            dup.close()


@contextlib.contextmanager
def stage_bars(console: Console) -> Iterator[Stage]:
    """Yield a :class:`Stage` that draws one bar per stage, kept on screen when it ends."""
    columns = (
        SpinnerColumn(finished_text="[green]✓[/]"),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    # No redirection of sys.stdout/stderr: quiet_output already sends them to the log.
    with Progress(*columns, console=console, redirect_stdout=False, redirect_stderr=False) as progress:

        @contextlib.contextmanager
        def stage(name: str, total: int = 1) -> Iterator[Callable[[], None]]:
            logging.getLogger("toolscout").info("stage: %s", name)
            task = progress.add_task(name, total=total)
            yield lambda: progress.advance(task)
            progress.update(task, completed=total)

        yield stage
