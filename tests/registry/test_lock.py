"""The retrain lock: exclusive, released on exit, taken over from a dead holder only."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from components.registry import LockHeld, RetrainLock


def test_second_holder_is_refused_until_release(tmp_path):
    path = str(tmp_path / "retrain.lock")
    with RetrainLock(path), pytest.raises(LockHeld, match="another retrain holds"):
        RetrainLock(path).acquire()
    with RetrainLock(path) as lock:  # released on exit, so it can be taken again
        assert lock.holder()["host"] == socket.gethostname()
    assert RetrainLock(path).holder() is None


def test_released_when_the_block_raises(tmp_path):
    path = str(tmp_path / "retrain.lock")
    with pytest.raises(KeyboardInterrupt), RetrainLock(path):
        raise KeyboardInterrupt
    assert RetrainLock(path).holder() is None


def test_a_dead_holder_on_this_host_is_taken_over_a_remote_one_is_not(tmp_path):
    path = tmp_path / "retrain.lock"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "started": 0}))
    with RetrainLock(str(path)) as lock:
        assert lock.holder()["pid"] != int(dead.stdout)
    path.write_text(json.dumps({"host": "another-node", "pid": 1, "started": 0}))
    with pytest.raises(LockHeld, match="another-node"):
        RetrainLock(str(path)).acquire()


def test_a_takeover_that_lost_the_race_puts_the_new_holders_lock_back(tmp_path):
    path = tmp_path / "retrain.lock"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = {"host": socket.gethostname(), "pid": int(dead.stdout), "started": 0}
    lock = RetrainLock(str(path))
    lock.record = {"host": socket.gethostname(), "pid": 0, "started": 0}
    # Judged stale from what was read; by the time it moves the file, another process has taken
    # the lock over and written its own record there.
    fresh = {"host": socket.gethostname(), "pid": 999_999_999, "started": 1}
    path.write_text(json.dumps(fresh))
    assert lock._take_over(stale) is False
    assert json.loads(path.read_text()) == fresh
    # Nothing left aside (the guard file is the takeovers' own, empty).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["retrain.lock", "retrain.lock.takeover"]


def test_no_third_process_takes_the_lock_while_a_takeover_that_lost_the_race_runs(tmp_path, monkeypatch):
    import components.registry.lock as lock_module

    path = tmp_path / "retrain.lock"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    stale = {"host": socket.gethostname(), "pid": int(dead.stdout), "started": 0}
    holder = RetrainLock(str(path))  # B: took the stale lock over already and holds it
    holder.acquire()
    late = RetrainLock(str(path))  # C: judged the same stale record a moment before B
    late.record = {"host": socket.gethostname(), "pid": 0, "started": 0}
    third: list[str] = []  # D: starts while C's takeover runs
    read = lock_module._read

    def read_then_third_starts(where: str) -> dict | None:
        record = read(where)
        if not third:
            third.append("started")
            try:
                RetrainLock(str(path)).acquire()
                third.append("holds it")
            except LockHeld:
                third.append("refused")
        return record

    monkeypatch.setattr(lock_module, "_read", read_then_third_starts)
    assert late._take_over(stale) is False
    monkeypatch.undo()
    # B keeps the lock, and D was refused: not two holders at once.
    assert third == ["started", "refused"] and holder.holder() == holder.record
    holder.release()


def test_release_leaves_a_lock_that_is_no_longer_its_own(tmp_path):
    path = tmp_path / "retrain.lock"
    lock = RetrainLock(str(path))
    lock.acquire()
    other = {"host": "another-node", "pid": 7, "started": 2}
    path.write_text(json.dumps(other))  # taken by hand from a holder thought dead
    lock.release()
    assert json.loads(path.read_text()) == other


def test_a_record_of_this_pid_from_an_earlier_process_is_stale(tmp_path):
    # A container restarted on the same host (same hostname, the lock on a volume) may run the new
    # job under the very pid its dead predecessor recorded: the pid is alive, the holder is not.
    import os

    path = tmp_path / "retrain.lock"
    ours = {"host": socket.gethostname(), "pid": os.getpid(), "started": 0}
    path.write_text(json.dumps({**ours, "process_start": "an-earlier-boot:12345"}))
    with RetrainLock(str(path)) as lock:
        assert lock.holder()["process_start"] not in (None, "an-earlier-boot:12345")
    # A record without a start (an older one) and a live pid: never judged stale.
    path.write_text(json.dumps(ours))
    with pytest.raises(LockHeld, match=f"pid {os.getpid()}"):
        RetrainLock(str(path)).acquire()


def test_losing_a_takeover_race_names_the_process_that_won_it(tmp_path, monkeypatch):
    import components.registry.lock as lock_module

    path = tmp_path / "retrain.lock"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout), "started": 0}))
    winner = {"host": "the-winner", "pid": 4242, "started": 1}
    take_over = lock_module.RetrainLock._take_over

    def another_process_got_there_first(self, stale):
        path.write_text(json.dumps(winner))  # it removed the stale lock and linked its own
        return take_over(self, stale)

    monkeypatch.setattr(lock_module.RetrainLock, "_take_over", another_process_got_there_first)
    with pytest.raises(LockHeld, match=r"the-winner.*4242"):
        RetrainLock(str(path)).acquire()


def test_a_remote_holder_is_taken_over_once_its_lease_runs_out_unrenewed(tmp_path):
    # A pod that died holding a lock on a shared volume: its pid means nothing here, and the lock
    # had to be removed by hand. Its lease says when it stopped renewing.
    path = tmp_path / "retrain.lock"
    now = time.time()
    live = {"host": "another-node", "pid": 1, "started": now - 3600, "lease_s": 600.0, "renewed": now - 30}
    path.write_text(json.dumps(live))
    with pytest.raises(LockHeld, match=r"taken over once not renewed for 600\.0 s"):
        RetrainLock(str(path)).acquire()
    path.write_text(json.dumps(live | {"renewed": now - 601}))
    with RetrainLock(str(path)) as lock:
        assert lock.holder()["host"] == socket.gethostname()
    # No lease (older code, the alias lock), or a lease that is not a number: never judged.
    for record in ({"host": "another-node", "pid": 1, "started": 0}, live | {"renewed": "0"}):
        path.write_text(json.dumps(record))
        with pytest.raises(LockHeld, match="another-node"):
            RetrainLock(str(path)).acquire()


def test_a_holder_renews_its_lease_until_it_releases_and_never_anothers(tmp_path):
    path = tmp_path / "retrain.lock"
    lock = RetrainLock(str(path))
    lock.acquire()
    first = lock.holder()
    assert first["lease_s"] == RetrainLock.lease_s and first["renewed"] == first["started"]
    assert lock.renewer is not None and lock.renewer.is_alive()
    assert lock.renew()
    renewed = lock.holder()
    assert renewed["renewed"] >= first["renewed"] and renewed["token"] == first["token"]
    assert renewed == lock.record
    lock.release()
    assert not path.exists()
    lock.renewer.join(timeout=30)  # woken by the release, not at its next tick
    assert not lock.renewer.is_alive()
    # A renewal under way as the release ran (it had read its own record just before): it must
    # write nothing back, or the lock stays held by no one.
    mine = dict(lock.record)
    lock.holder = lambda: mine  # what it read before the release removed the file
    assert lock.renew() is False and not path.exists()
    del lock.holder
    # Nor over another holder's record, nor does a lock that never held write over one.
    other = {"host": "another-node", "pid": 1, "started": 0, "token": "theirs"}
    path.write_text(json.dumps(other))
    assert lock.renew() is False and json.loads(path.read_text()) == other
    tokenless = {"host": "another-node", "pid": 1, "started": 0}
    path.write_text(json.dumps(tokenless))
    never = RetrainLock(str(path))
    assert never.renew() is False and json.loads(path.read_text()) == tokenless
    # The alias lock is held for a few calls: no lease, no thread.
    from components.registry import AliasLock

    with AliasLock(str(tmp_path / "alias.lock")) as alias:
        assert "lease_s" not in alias.holder() and alias._renewing is None
