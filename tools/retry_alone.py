"""make test's second look at a test that failed beside the other lanes: run it again alone.

make test runs four xdist lanes on two cores, and many tests judge real processes against
real time (a stall window, a poll's deadline, detection within a window and two polls). A
test that failed there is run once more, alone in one process, with the same environment:

- it passes alone: make test passes, and says in capitals which test failed only under the
  lanes' load, appending it with the date to `.flaky.log`. That is a test to fix (its bound
  judged the host's load, not the product): CONTRIBUTING.md, "A test that failed only beside
  the other lanes".
- it fails again, is skipped, or is not found: make test fails.
- more than MAX_ALONE tests failed, or pytest recorded none (a collection or internal error):
  nothing is rerun and make test fails. Several failures at once are a change's, not load's.

Reads pytest's own record of the last run's failures (.pytest_cache/v/cache/lastfailed).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

MAX_ALONE = 3
LASTFAILED = Path(".pytest_cache/v/cache/lastfailed")
FLAKY_LOG = Path(".flaky.log")
# Each tier's test ran (and failed) in the run before: alone, only its result is judged.
TIER_VARS = ("REPLAYWATCH_REQUIRE_LAUNCHPAD", "REPLAYWATCH_REQUIRE_RLLIB")


def node_ids(recorded: dict[str, object]) -> list[str]:
    """The failed tests' ids as a plain run collects them: --dist loadgroup appends the
    group (`@agents`) to an id, which a run without xdist does not."""
    return sorted({re.sub(r"@[A-Za-z0-9_-]+$", "", nodeid) for nodeid in recorded})


def passed_all(report: Path, wanted: int) -> bool:
    """Every test of the rerun ran and passed (a skip, or none collected, is no pass)."""
    try:
        suite = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return False
    cases = list(suite.iter("testcase"))  # a test's subtests may add cases of their own
    spoiled = any(child.tag in ("failure", "error", "skipped") for c in cases for child in c)
    return not spoiled and len(cases) >= wanted


def main() -> int:
    try:
        recorded = json.loads(LASTFAILED.read_text())
    except (OSError, ValueError):
        recorded = {}
    ids = node_ids(recorded)
    if not ids:
        print("make test: pytest failed and recorded no failed test (collection or internal "
              "error): nothing to rerun")
        return 1
    if len(ids) > MAX_ALONE:
        print(f"make test: {len(ids)} tests failed, more than {MAX_ALONE}: not rerun alone")
        return 1
    print(f"\nmake test: rerunning alone the {len(ids)} test(s) that failed beside the other "
          "lanes:")
    for nodeid in ids:
        print(f"  {nodeid}")
    env = {k: v for k, v in os.environ.items() if k not in TIER_VARS}
    with tempfile.TemporaryDirectory(prefix="rw-alone-") as tmp:
        report = Path(tmp) / "alone.xml"
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p",
                              "no:cacheprovider", f"--junitxml={report}", *ids], env=env)
        ok = rc == 0 and passed_all(report, len(ids))
    if not ok:
        print(f"make test: failed again alone (pytest exit {rc}): {', '.join(ids)}")
        return 1
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with FLAKY_LOG.open("a") as log:
        for nodeid in ids:
            log.write(f"{stamp}\t{nodeid}\n")
    print("\nmake test: PASSED ALONE, FAILED ONLY BESIDE THE OTHER LANES (a test whose bound "
          f"judged the host's load; appended to {FLAKY_LOG}, see CONTRIBUTING.md):")
    for nodeid in ids:
        print(f"  {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
