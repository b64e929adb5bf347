"""The process harness leaves nothing behind: a child's own-session descendants die with it.

Ray starts its GCS, raylet and workers in sessions of their own; a signal to the agent's
process group missed them, and a killed distributed agent's learner and actors ran on
for seconds in the next test's time.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from harness.procs import PYTHON, Proc, alive, descendants, wait_until

# A parent that starts a grandchild in a session of its own, as Ray does, and says its pid.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         start_new_session=True)
print('{"grandchild": %d}' % child.pid, flush=True)
time.sleep(120)
"""



def test_kill_reaches_a_descendant_in_its_own_session(spawn: Callable[..., Proc]) -> None:
    parent = spawn([PYTHON, "-c", PARENT], name="parent")
    grandchild = parent.announce(timeout_s=30)["grandchild"]
    assert grandchild in descendants(parent.pid)
    assert os.getpgid(grandchild) != os.getpgid(parent.pid)  # out of reach of killpg
    parent.kill()
    assert wait_until(lambda: not alive(grandchild), timeout_s=10)


def test_terminate_reaches_it_too_after_the_child_exits(spawn: Callable[..., Proc]) -> None:
    parent = spawn([PYTHON, "-c", PARENT], name="parent")
    grandchild = parent.announce(timeout_s=30)["grandchild"]
    assert parent.terminate(timeout_s=5) is not None  # TERM ends the parent itself
    assert wait_until(lambda: not alive(grandchild), timeout_s=10)
