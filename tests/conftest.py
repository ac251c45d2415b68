"""Suite-wide check: nothing a test started outlives the session.

A thread still running when the interpreter exits is killed in whatever it is doing; one
inside native code (a torch op, a C++ library) aborts the process after pytest printed its
summary (``terminate called without an active exception``, SIGABRT), and a child process
left behind holds ports and files. So every test and fixture joins what it starts, and this
checks it: after the session's fixtures are torn down, each Python thread but the main one
and each child process gets ``GRACE_S`` seconds (``HC_TEST_LEFTOVER_GRACE_S``, 10) to end; any still there is listed (with the
test during which it first appeared and, for a thread, where it is now) and fails the run.

``LEFTOVER_OK`` names the threads and processes that are not ours to stop: ones a library
starts once for the life of the process and stops itself at exit (tqdm's monitor thread, a
daemon asleep in Python; multiprocessing's resource tracker and forkserver, which end when
this process closes their pipe).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Generator

import psutil
import pytest

# Threads/processes still finishing (a deadline-bound call, a server's exit) get this long.
GRACE_S = float(os.environ.get("HC_TEST_LEFTOVER_GRACE_S", "10"))
LEFTOVER_OK = re.compile(r"^tqdm_monitor$|multiprocessing\.(resource_tracker|forkserver) import main")

# thread / (child pid, its start time) -> the test during which it first appeared
_thread_origin: weakref.WeakKeyDictionary[threading.Thread, str] = weakref.WeakKeyDictionary()
_proc_origin: dict[tuple[int, float], str] = {}
_report: list[str] = []


def _children() -> list[psutil.Process]:
    """This process's live descendants (a zombie has ended; one gone meanwhile is skipped)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def _note(nodeid: str) -> None:
    for t in threading.enumerate():
        _thread_origin.setdefault(t, nodeid)
    for p in _children():
        _proc_origin.setdefault(_key(p), nodeid)


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return "?"


def _key(p: psutil.Process) -> tuple[int, float]:
    try:
        return p.pid, p.create_time()
    except psutil.Error:
        return p.pid, 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    _note("(before " + item.nodeid + ")")
    yield
    _note(item.nodeid)


def _leftovers() -> tuple[list[threading.Thread], list[psutil.Process]]:
    # An executor nobody references any more (left in a reference cycle) ends its idle
    # workers once collected: collect first, so only what is still owned is reported.
    gc.collect()
    until = time.monotonic() + GRACE_S
    threads = [t for t in threading.enumerate()
               if t is not threading.main_thread() and not LEFTOVER_OK.search(t.name)]
    for t in threads:
        t.join(max(until - time.monotonic(), 0.0))
    procs = [p for p in _children() if not LEFTOVER_OK.search(_cmdline(p))]
    _, procs = psutil.wait_procs(procs, timeout=max(until - time.monotonic(), 0.0))
    return [t for t in threads if t.is_alive()], procs


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    threads, procs = _leftovers()
    frames = sys._current_frames()
    for t in threads:
        where = "".join(traceback.format_stack(frames[t.ident])[-3:]) if t.ident in frames else ""
        _report.append(f"thread {t.name!r} (daemon={t.daemon}), started during "
                       f"{_thread_origin.get(t, '?')}, now at:\n{where}")
    for p in procs:
        _report.append(f"process {p.pid} ({_cmdline(p)[:200]}), started during "
                       f"{_proc_origin.get(_key(p), '?')}")
    if _report and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _report:
        terminalreporter.section("left running at the end of the session", sep="=", red=True)
        for line in _report:
            terminalreporter.write_line(line)
        terminalreporter.write_line("Every test and fixture must join the threads and stop the "
                                    "processes it starts (see tests/conftest.py).", red=True)
