"""Item 8 on a real hang, without any probe: Reverb alone plus `--trainer-pid`.

`tests/support/starved_learner.py` is the seed's synchronous layout made small (a limiter
that never blocks inserts, 4 parallel batching workers of 16, 40 samples of credit dealt
round robin): its main thread hangs in next() of a real tf.data Reverb dataset. The sidecar
core watches only the Reverb server (the learner's own probe is not given to it) and has the
learner's pid. When `sample_blocked` opens, the keeper takes two real py-spy dumps a second
apart, sees the loop inside next() in both, and the next cycle names `worker_starvation`
"from stacks" with the stacks as evidence.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from harness.procs import Proc
from replaywatch import bundle as bd
from replaywatch.config import PollConfig, WatchConfig
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.model import Finding
from replaywatch.state import Published
from replaywatch.wiring import build_sidecar
from tests.support.repro import assert_replays, wait_for_bundles

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

POLL_S = 0.2
WINDOW_S = 1.5
PY_SPY = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")


def found(state: Published, kind: str) -> Finding | None:
    return next((f for f in state.findings if f.kind == kind), None)


@pytest.mark.skipif(not Path(PY_SPY).exists(), reason="py-spy is not installed")
def test_a_hung_synchronous_loop_is_worker_starvation_from_two_real_dumps(
        spawn: Callable[..., Proc], tmp_path: Path) -> None:
    learner = spawn([sys.executable, "tests/support/starved_learner.py", "--workers", "4",
                     "--batch", "16", "--credit", "40"], name="starved-learner")
    job = learner.announce()
    th = Thresholds(stall_window_s=WINDOW_S, min_history_s=0.5, startup_grace_s=1.0)
    # Polled every 0.2 s, each poll given 1 s: at the default 0.16 s, loaded cores left the
    # learner's server unanswered for polls on end, read (rightly) as `checkpointing`, a
    # server holding its lock, and the starvation went unjudged for the test's 60 s.
    config = WatchConfig(targets=(job["reverb"],), trainer_pid=int(job["pid"]),
                         poll=PollConfig(interval_s=POLL_S, timeout_s=1.0, history_s=300.0),
                         thresholds=th)
    seen: list[str] = []
    with build_sidecar(config, incidents_path=str(tmp_path / "incidents.db")) as core:
        deadline, starved, opened_at = time.monotonic() + 60, None, None
        while time.monotonic() < deadline and starved is None:
            state = core.poller.tick()
            assert_replays(core, state)
            seen += [f.kind for f in state.findings]
            if opened_at is None and found(state, "sample_blocked") is not None:
                opened_at = time.monotonic()
            starved = found(state, "worker_starvation")
            time.sleep(POLL_S)
        assert opened_at is not None, set(seen)
        assert starved is not None, set(seen)
        print(f"\nworker_starvation from stacks {time.monotonic() - opened_at:.2f}s after "
              "sample_blocked opened")
        assert starved.evidence["from_stacks"] is True
        assert starved.evidence["loop_thread"] == "MainThread"
        assert starved.evidence["loop_in"] == "tf.data IteratorGetNext"
        assert any("iterator_get_next" in f for f in starved.evidence["second_dump"])
        assert "num_parallel_calls=1" in starved.fix
        # It stays named so while the hang lasts.
        for _ in range(5):
            time.sleep(POLL_S)
            assert found(core.poller.tick(), "worker_starvation") is not None
        # The bundles written when sample_blocked, then worker_starvation, opened carry
        # the two dumps, deduplicated: one entry per distinct stack, with its count.
        kept = {bd.read(p).live["findings"][0]["kind"]: bd.read(p)
                for p in wait_for_bundles(core, 2)}
        assert set(kept) == {"sample_blocked", "worker_starvation"}
        for kind, b in kept.items():
            assert b.doc["reason"].startswith(f"opened critical {kind}:")
            assert len(b.doc["stacks"]) == 2  # the dump and the one a second later
            for dump in b.doc["stacks"].values():
                assert dump["thread_count"] >= sum(g["count"] for g in dump["stacks"]) >= 1
            assert not [m for m in b.doc["missing"] if m["what"].startswith("stacks")]
