"""A workload forked from the zygote is the process `python SCRIPT ARGS` would be, as far as
a test can see: its own session, its argv, environment, working directory and output, its
exit status (a signal's included), and it dies with the client that asked for it.

The zygote here preloads only `json`: what is checked is the fork, not TensorFlow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from harness import procs
from harness.procs import PYTHON, ROOT, Forked, alive, wait_until

SCRIPT = (ROOT / "tests" / "support" / "zygote_child.py").read_text()



def _fork(tmp_path: Path, *args: str) -> tuple[Forked, Path]:
    script, log = tmp_path / "child.py", tmp_path / f"child-{args[0]}.log"
    script.write_text(SCRIPT)
    with open(log, "wb") as out:
        child = Forked([PYTHON, str(script), *args],
                       {**os.environ, "ZYGOTE_TEST": "seen", "PYTHONUNBUFFERED": "1"},
                       out.fileno(), ("json",))
    return child, log


def _record(log: Path) -> dict:
    wait_until(lambda: "{" in log.read_text(), timeout_s=30)
    return dict(json.loads(log.read_text().splitlines()[0]))


def test_a_forked_child_is_its_script_run_as_main_in_a_session_of_its_own(
        tmp_path: Path) -> None:
    child, log = _fork(tmp_path, "3")
    assert child.wait(timeout=30) == 3
    record = _record(log)
    assert record["pid"] == child.pid and record["sid"] == child.pid
    assert record["argv"] == [str(tmp_path / "child.py"), "3"]
    assert record["cwd"] == str(ROOT) and record["path0"] == str(tmp_path)
    assert record["env"] == "seen" and record["name"] == "__main__"
    assert "to stderr" in log.read_text()


def test_a_signalled_child_reads_as_popen_would_and_a_wait_can_time_out(
        tmp_path: Path) -> None:
    child, log = _fork(tmp_path, "sleep")
    _record(log)
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    os.killpg(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert child.poll() == -signal.SIGKILL


def test_a_module_run_with_dash_m_writes_to_pipes_the_caller_reads(tmp_path: Path) -> None:
    child = Forked([PYTHON, "-u", "-m", "tests.support.zygote_child", "5"],
                   {**os.environ, "ZYGOTE_TEST": "piped"}, None, ("json",))
    assert child.stdout is not None and child.stderr is not None
    record = json.loads(child.stdout.readline())
    assert record["argv"] == [str(ROOT / "tests" / "support" / "zygote_child.py"), "5"]
    assert record["path0"] == str(ROOT) and record["name"] == "__main__"
    assert record["env"] == "piped" and record["sid"] == child.pid
    assert child.stderr.readline() == "to stderr\n"
    assert child.wait(timeout=30) == 5


def test_forked_children_draw_their_own_random_numbers(tmp_path: Path) -> None:
    script = tmp_path / "draw.py"
    script.write_text("import random, numpy\nprint(random.random(), numpy.random.rand())\n")
    draws = []
    for n in range(2):
        log = tmp_path / f"draw-{n}.log"
        with open(log, "wb") as out:
            child = Forked([PYTHON, str(script)], dict(os.environ), out.fileno(),
                           ("numpy", "random"))
        assert child.wait(timeout=30) == 0
        draws.append(log.read_text().split())
    assert draws[0][0] != draws[1][0] and draws[0][1] != draws[1][1], draws


def test_a_zygote_that_would_fork_ray_refuses_to_start(tmp_path: Path) -> None:
    # The main venv has Ray (its multi-node tests), so the refusal can be seen here.
    with pytest.raises(RuntimeError, match="imports Ray"):
        Forked([PYTHON, str(tmp_path / "never.py")], dict(os.environ), 1, ("ray",))


def test_a_child_whose_client_leaves_is_killed(tmp_path: Path) -> None:
    child, log = _fork(tmp_path, "sleep")
    pid = _record(log)["pid"]
    child._conn.close()  # as when the test's process dies
    assert wait_until(lambda: not alive(pid), timeout_s=10)


def test_a_child_whose_zygote_dies_is_killed_and_reads_as_killed(tmp_path: Path) -> None:
    child, log = _fork(tmp_path, "sleep")
    pid = _record(log)["pid"]
    zygote, _ = procs._zygotes[("json",)]
    zygote.kill()  # its children are in sessions of their own: only the client can end them
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert wait_until(lambda: not alive(pid), timeout_s=10)
    again, _ = _fork(tmp_path, "0")  # the next child gets a new zygote
    assert again.wait(timeout=60) == 0


def test_a_zygote_that_dies_as_it_is_asked_is_replaced_and_the_child_starts(
        tmp_path: Path) -> None:
    # A zygote that is dying still reads as alive, and its listening socket still queues a
    # request, which its death resets unread: a fresh clone's run failed there once.
    first, _ = _fork(tmp_path, "0")
    assert first.wait(timeout=30) == 0
    zygote, _ = procs._zygotes[("json",)]
    zygote.send_signal(signal.SIGSTOP)  # alive to poll(), answering nothing
    threading.Timer(1.0, zygote.kill).start()
    child, _ = _fork(tmp_path, "4")
    assert child.wait(timeout=60) == 4
    assert zygote.poll() == -signal.SIGKILL
    assert procs._zygotes[("json",)][0] is not zygote
