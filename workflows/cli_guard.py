"""One red line and exit code 1 for the expected failures of a ``toolscout`` command."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console

from components.config import ConfigError
from components.data.rejects import DatasetError
from components.registry import LockHeld

console = Console(stderr=True)


F = TypeVar("F", bound=Callable[..., Any])


def guarded(fn: F) -> F:
    """Turn the expected failures into one red line and exit code 1, not a traceback.

    ``TOOLSCOUT_DEBUG=1`` lets the exception through with its traceback, since a ``KeyError`` or
    ``ValueError`` from a bug looks the same here as one from bad input.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        # TypeError and AttributeError too: a config value of the wrong shape (null where a number
        # goes, a list where a mapping does) surfaced as a traceback from deep in the code.
        except (
            ConfigError,
            DatasetError,
            OSError,
            LookupError,
            LockHeld,
            ValueError,
            TypeError,
            AttributeError,
        ) as e:
            if os.environ.get("TOOLSCOUT_DEBUG"):
                raise
            # A bare KeyError prints as "'train'": name the type for the reader.
            what = f"{type(e).__name__}: {e}" if isinstance(e, KeyError) else str(e)
            console.print(f"[bold red]error:[/] {what}")
            console.print("[dim](set TOOLSCOUT_DEBUG=1 for the traceback)[/]")
            raise typer.Exit(1) from e

    return wrapper  # type: ignore[return-value]
