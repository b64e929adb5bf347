"""make test's rerun alone (tools/retry_alone.py), on real pytest runs in a scratch directory:
a test that passes alone is named and logged, one that fails again fails, and nothing is
rerun where pytest recorded no failure or more than three."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts pytest in a process of its own

TOOL = Path(__file__).resolve().parent.parent / "tools" / "retry_alone.py"
# pytest's record says both failed; alone, one passes and one fails again
TESTS = '''
def test_passes_alone():
    assert True

def test_fails_always():
    assert False
'''


def run(tmp_path: Path, failed: list[str]) -> tuple[int, str]:
    (tmp_path / "test_scratch.py").write_text(TESTS)
    cache = tmp_path / ".pytest_cache" / "v" / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "lastfailed").write_text(json.dumps({nodeid: True for nodeid in failed}))
    done = subprocess.run([sys.executable, str(TOOL)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    return done.returncode, done.stdout


def test_a_test_that_passes_alone_passes_make_test_and_is_logged(tmp_path: Path) -> None:
    rc, out = run(tmp_path, ["test_scratch.py::test_passes_alone@frameworks"])
    assert rc == 0, out
    assert "PASSED ALONE, FAILED ONLY BESIDE THE OTHER LANES" in out
    (line,) = (tmp_path / ".flaky.log").read_text().splitlines()
    assert line.endswith("\ttest_scratch.py::test_passes_alone")  # the group suffix gone


def test_a_test_that_fails_again_alone_fails_make_test(tmp_path: Path) -> None:
    rc, out = run(tmp_path, ["test_scratch.py::test_passes_alone",
                             "test_scratch.py::test_fails_always"])
    assert rc == 1 and "failed again alone" in out, out
    assert not (tmp_path / ".flaky.log").exists()


def test_a_test_not_found_alone_is_no_pass(tmp_path: Path) -> None:
    rc, out = run(tmp_path, ["test_scratch.py::test_renamed_since"])
    assert rc == 1 and "failed again alone" in out, out


@pytest.mark.parametrize("failed, said", [
    ([], "recorded no failed test"),
    ([f"test_scratch.py::test_{i}" for i in range(4)], "4 tests failed, more than 3"),
])
def test_nothing_is_rerun_without_a_record_or_past_three(
        tmp_path: Path, failed: list[str], said: str) -> None:
    rc, out = run(tmp_path, failed)
    assert rc == 1 and said in out and "rerunning" not in out, out
