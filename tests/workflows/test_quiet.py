"""Quiet output: library chatter at every level goes to the log file, the terminal gets the console."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from rich.console import Console

from workflows.quiet import quiet_output, stage_bars


def test_quiet_output_sends_every_kind_of_output_to_the_log(tmp_path: Path, capfd) -> None:
    log = tmp_path / "w" / "run.log"
    with quiet_output(str(log)) as console:
        print("from print")
        sys.stderr.write("from sys.stderr\n")
        os.write(2, b"from fd 2\n")  # what C/C++ code (Ray's core) writes
        subprocess.run([sys.executable, "-c", "print('from a child process')"], check=True)
        logging.getLogger("some.library").info("a log record")
        warnings.warn("a library warning", UserWarning, stacklevel=1)
        console.print("for the terminal")
    text = log.read_text()
    for line in ("from print", "from sys.stderr", "from fd 2", "from a child process", "a log record"):
        assert line in text, line
    assert "a library warning" in text
    assert "for the terminal" not in text
    out, err = capfd.readouterr()
    assert "for the terminal" in out
    assert not {"from print", "from fd 2", "from a child process", "a log record"} & {
        line.strip() for line in (out + err).splitlines()
    }
    # Everything is back in place afterwards.
    print("after")
    os.write(2, b"fd 2 after\n")
    out, err = capfd.readouterr()
    assert "after" in out and "fd 2 after" in err
    assert "after" not in log.read_text()


def test_a_failure_restores_output_and_names_the_log(tmp_path: Path, capfd) -> None:
    log = tmp_path / "run.log"
    level = logging.getLogger().level
    with pytest.raises(ValueError, match="boom"), quiet_output(str(log)):
        print("before the failure")
        raise ValueError("boom")
    out, _ = capfd.readouterr()
    assert "failed" in out and str(log) in " ".join(out.split())
    assert "before the failure" in log.read_text()
    assert logging.getLogger().level == level
    print("restored")
    assert "restored" in capfd.readouterr().out


def test_stage_bars_draw_one_finished_bar_per_stage() -> None:
    buf = io.StringIO()
    with stage_bars(Console(file=buf, width=80)) as stage:
        with stage("alpha", 2) as step:
            step()
            step()
        with stage("beta") as step:
            step()
    lines = [line for line in buf.getvalue().splitlines() if line.strip()]
    assert len(lines) == 2
    assert "alpha" in lines[0] and "2/2" in lines[0]
    assert "beta" in lines[1] and "1/1" in lines[1]
