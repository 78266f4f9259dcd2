"""One retrain at a time, and one alias move at a time: exclusive lock files beside the registry's
local state (:class:`RetrainLock` for a whole round, :class:`AliasLock` for the moment an alias
moves).

The lock file is created whole or not at all: the holder's record (host, pid, start times) is
written to a private file first and hard-linked to the lock's name, which fails if the name
exists. Two retrains that start together cannot both hold it, and a crash never leaves an empty
lock that no one could judge. A lock left by a process that died on this host is taken over. One
from another host (a pod on a shared volume) cannot be judged by its pid; a holder keeps a lease
instead (``lease_s``, the retrain and ingest locks): a thread renews the record's ``renewed`` time
every tenth of the lease, and a record from another host not renewed for a whole lease is stale.
A record without a lease (older code, the short alias lock) from another host is never judged: its
owner may be alive, so remove the file by hand, as the error says.
Takeovers on a host take turns under an ``flock`` on a guard file beside the lock (released by the
kernel if the process dies): each reads the record again under it and removes the lock file only
if it is still the one judged stale, so the name is never missing while a live process holds it.
(Moving the stale file aside and putting back one that turned out live left a moment with no
lock file, in which a third process took the lock beside the holder.) Release removes the file
only while it still holds this process's record. On Kubernetes the CronJob's
``concurrencyPolicy: Forbid`` is the first guard and this file the second.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from types import TracebackType

log = logging.getLogger(__name__)


class LockHeld(RuntimeError):
    """Another process holds the lock."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _process_start(pid: int) -> str | None:
    """When process ``pid`` started, as ``<boot id>:<start tick>`` (Linux ``/proc``); ``None`` where
    that cannot be read. A pid alone is reused: by a later process after this one died, and across
    a container restart, where the new job may get the very pid its dead predecessor recorded."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # Field 22 (starttime); the command name (field 2) may hold spaces and parentheses.
    return f"{boot}:{stat.rsplit(')', 1)[1].split()[19]}"


def _read(path: str) -> dict | None:
    """The record in the lock file at ``path``; ``None`` if there is none."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:  # not a record this code wrote: never judged stale
        return {"host": "?", "pid": -1, "started": 0}


class RetrainLock:
    """``with RetrainLock(path): ...`` holds ``path`` for the block, or raises :class:`LockHeld`."""

    # Who a refusal names as the holder.
    holder_is = "another retrain"
    # Seconds a holder's record stays valid to other hosts without a renewal (None: no lease). A
    # round or an ingest holds the lock for minutes to hours; ten minutes outlasts clock skew and
    # a stalled renewal by far.
    lease_s: float | None = 600.0

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self.held = False
        self.record: dict = {}
        self._renewing: threading.Event | None = None
        self.renewer: threading.Thread | None = None  # the thread renewing the lease while held
        # A renewal and the release take turns: a renewal that had read "mine" just before the
        # release removed the file would write the record back, a lock held by no one.
        self._turns = threading.Lock()

    def holder(self) -> dict | None:
        """The current holder's record, or ``None`` when the lock is free."""
        return _read(self.path)

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self.record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "process_start": _process_start(os.getpid()),
            "token": uuid.uuid4().hex,  # which holding this is, whatever its renewals changed
        }
        if self.lease_s is not None:
            self.record |= {"lease_s": self.lease_s, "renewed": self.record["started"]}
        mine = self._private(self.record)
        try:
            for _ in range(3):
                try:
                    os.link(mine, self.path)  # the whole record under the lock's name, or nothing
                except FileExistsError:
                    holder = self.holder()
                    if holder is None or self._stale(holder):
                        # Released meanwhile, or its process is gone (taken over now, or by another
                        # process that got there first: the next try reads who holds it then).
                        if holder is not None:
                            self._take_over(holder)
                        continue
                    lease = holder.get("lease_s") if holder.get("host") != self.record["host"] else None
                    raise LockHeld(
                        f"{self.holder_is} holds {self.path} (host {holder.get('host')}, "
                        f"pid {holder.get('pid')}); "
                        + (
                            f"it is taken over once not renewed for {lease} s (its lease)"
                            if lease
                            else "remove the file if that process is gone"
                        )
                    ) from None
                self.held = True
                self._start_renewing()
                return
            raise LockHeld(f"could not take {self.path}")
        finally:
            os.unlink(mine)

    def _stale(self, holder: dict) -> bool:
        """Whether ``holder`` is a process of this host that is gone (its pid free, or taken by a
        process that started after it: the recorded start differs), or one of another host whose
        lease ran out (not renewed for ``lease_s`` seconds)."""
        pid = holder.get("pid", -1)
        if holder.get("host") != self.record["host"]:
            lease, renewed = holder.get("lease_s"), holder.get("renewed")
            if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lease, renewed)):
                return False  # no lease (older code, the alias lock): never judged from here
            return time.time() - float(renewed) > float(lease)  # type: ignore[arg-type]
        if not isinstance(pid, int) or pid <= 0:
            return False
        if not _alive(pid):
            return True
        recorded = holder.get("process_start")
        return recorded is not None and _process_start(pid) not in (None, recorded)

    def _private(self, record: dict) -> str:
        """``record`` written whole to a file of this process's own beside the lock (linked or
        renamed to the lock's name: a reader never sees half a record). Returns its path."""
        mine = f"{self.path}.{uuid.uuid4().hex}.new"
        with open(mine, "w") as f:
            json.dump(record, f)
        return mine

    @contextlib.contextmanager
    def _takeover_turn(self) -> Iterator[None]:
        """One takeover (or renewal) of this lock at a time on this host: an ``flock`` on a guard
        file beside it, which the kernel frees if the process dies."""
        with open(f"{self.path}.takeover", "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            yield

    def _take_over(self, stale: dict) -> bool:
        """Remove the lock file if it still holds ``stale``; ``True`` when the lock is free then,
        ``False`` if another process's record is there by now (left as it is)."""
        with self._takeover_turn():
            holder = _read(self.path)
            if holder == stale:
                os.unlink(self.path)
                return True
            return holder is None

    def _mine(self, holder: dict | None) -> bool:
        token = self.record.get("token")
        return holder is not None and token is not None and holder.get("token") == token

    def _start_renewing(self) -> None:
        if self.lease_s is None:
            return
        self._renewing = stop = threading.Event()
        every = self.lease_s / 10

        def renew() -> None:
            while not stop.wait(every):
                try:
                    if not self.renew():
                        if self.held:  # not a release: another holder took the lock over
                            log.error("lost %s: its lease ran out and another holder took it", self.path)
                        return
                except OSError as e:  # tried again at the next tick; the lease is ten ticks long
                    log.warning("could not renew the lease of %s: %s", self.path, e)

        name = f"lease {os.path.basename(self.path)}"
        self.renewer = threading.Thread(target=renew, name=name, daemon=True)
        self.renewer.start()

    def renew(self) -> bool:
        """Write this holder's record again with ``renewed`` now (whole, by a rename), while the lock
        still holds it; ``False`` (and nothing written) once it does not, or once released."""
        # Under the takeovers' guard too: a takeover on this host reads and removes the record as
        # one step, and a renewal must not land between the two.
        with self._turns, self._takeover_turn():
            if not self.held or not self._mine(self.holder()):
                return False
            record = self.record | {"renewed": time.time()}
            os.replace(self._private(record), self.path)
            self.record = record
            return True

    def release(self) -> None:
        if self._renewing is not None:
            self._renewing.set()
            self._renewing = None
        with self._turns:
            if self.held:
                self.held = False
                if self._mine(self.holder()):  # never another process's lock
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.path)

    def __enter__(self) -> RetrainLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class AliasLock(RetrainLock):
    """The lock of an alias move (a promotion or rollback: a few registry reads and writes),
    waited for up to ``wait_s`` seconds before :class:`LockHeld`.

    Why apart from the retrain lock: a round holds that one for as long as it trains, and an
    operator's rollback must not wait for a round to end. A round takes this one only to check
    that the champion is the one it gated against and to promote, as one step
    (:meth:`components.registry.ModelRegistry.promote` with ``replacing``)."""

    holder_is = "another alias move"
    wait_s = 30.0
    lease_s = None  # held for a few registry calls: no renewal thread per move

    def __init__(self, path: str, wait_s: float | None = None) -> None:
        super().__init__(path)
        if wait_s is not None:
            self.wait_s = wait_s

    def acquire(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                return super().acquire()
            except LockHeld:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)
