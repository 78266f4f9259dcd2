"""One retrain at a time: an exclusive lock file beside the registry's local state.

``os.open(O_CREAT | O_EXCL)`` either creates the file or fails, atomically, so two retrains that
start together cannot both hold it. The file names its holder (host, pid, start time); a lock left
by a process that died on this host is taken over, one from another host is not (its owner may be
alive: remove the file by hand, as the error says). On Kubernetes the CronJob's
``concurrencyPolicy: Forbid`` is the first guard and this file the second.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from types import TracebackType


class LockHeld(RuntimeError):
    """Another retrain holds the lock."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RetrainLock:
    """``with RetrainLock(path): ...`` holds ``path`` for the block, or raises :class:`LockHeld`."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.held = False

    def holder(self) -> dict | None:
        """The current holder's record, or ``None`` when the lock is free."""
        try:
            with open(self.path) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except ValueError:
            return {"host": "?", "pid": -1, "started": 0}  # being written right now

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        record = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self.holder() or {}
                stale = (
                    holder.get("host") == record["host"]
                    and holder.get("pid", -1) > 0
                    and not _alive(holder["pid"])
                )
                if stale:
                    os.unlink(self.path)  # its process is gone: take over
                    continue
                raise LockHeld(
                    f"another retrain holds {self.path} (host {holder.get('host')}, "
                    f"pid {holder.get('pid')}); remove the file if that process is gone"
                ) from None
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self.held = True
            return
        raise LockHeld(f"could not take {self.path}")

    def release(self) -> None:
        if self.held:
            self.held = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> RetrainLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
