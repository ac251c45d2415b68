"""tests/conftest.py fails a run that leaves a thread or a child process running at its end
(a thread inside native code at interpreter exit aborts the process after the summary), and
passes one that joins what it starts. Each case is a real pytest run in a subprocess, on a
copy of the conftest."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

LEAKS_A_THREAD = '''
import threading

def test_leaks() -> None:
    stop = threading.Event()
    threading.Thread(target=stop.wait, name="leaky-reader", daemon=True).start()
'''

LEAKS_A_PROCESS = '''
import subprocess, sys
from pathlib import Path

def test_leaks() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path("pid").write_text(str(p.pid))
'''

JOINS = '''
import subprocess, sys, threading

def test_joins() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, name="joined-reader")
    t.start()
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    stop.set()
    t.join()
    p.wait()
'''


def run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_case.py").write_text(body)
    env = dict(os.environ, HC_TEST_LEFTOVER_GRACE_S="0.5")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


def test_a_thread_left_running_fails_the_run_and_names_its_test(tmp_path: Path) -> None:
    r = run(tmp_path, LEAKS_A_THREAD)
    assert "1 passed" in r.stdout
    assert r.returncode == pytest.ExitCode.TESTS_FAILED, r.stdout[-2000:]
    assert "left running at the end of the session" in r.stdout
    assert "thread 'leaky-reader' (daemon=True), started during test_case.py::test_leaks" in r.stdout


def test_a_child_process_left_running_fails_the_run(tmp_path: Path) -> None:
    r = run(tmp_path, LEAKS_A_PROCESS)
    pid = int((tmp_path / "pid").read_text())
    try:
        assert r.returncode == pytest.ExitCode.TESTS_FAILED, r.stdout[-2000:]
        assert f"process {pid} (" in r.stdout
        assert "started during test_case.py::test_leaks" in r.stdout
    finally:  # orphaned when the inner run exited: ours to stop
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_run_that_joins_what_it_starts_passes(tmp_path: Path) -> None:
    r = run(tmp_path, JOINS)
    assert r.returncode == pytest.ExitCode.OK, r.stdout[-2000:]
    assert "left running" not in r.stdout
