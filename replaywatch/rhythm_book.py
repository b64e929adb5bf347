"""The rhythm book: each target's learned rhythms (diagnosis/rhythm.py), kept between cycles
and across a sidecar restart.

The findings keeper folds each cycle's view into it and hands the rhythms to the diagnosis
with the view. Every `save_every_s` the book writes them to the incident log's `rhythms`
table; a restarted sidecar reads them back (`resume`), so a job whose learner steps every
12 s is judged by that from the first poll, not paged while the rhythm is learned again.
"""

from __future__ import annotations

import logging

from replaywatch.diagnosis import stall_window as sw
from replaywatch.diagnosis.rhythm import Rhythm
from replaywatch.diagnosis.thresholds import Thresholds
from replaywatch.diagnosis.window import TargetView
from replaywatch.incidents import IncidentLog

log = logging.getLogger("replaywatch.rhythms")

SAVE_EVERY_S = 10.0
# A series not updated for this long belongs to a job long gone: forgotten.
FORGET_AFTER_S = 7 * 24 * 3600.0


class RhythmBook:
    """By target, then series: the rhythms learned so far. One writer (the poller thread)."""

    def __init__(self, store: IncidentLog | None, save_every_s: float = SAVE_EVERY_S):
        self._store = store
        self._save_every_s = save_every_s
        self._rhythms: dict[str, dict[str, Rhythm]] = {}
        self._saved_at = float("-inf")

    def resume(self) -> None:
        """What a sidecar before this one learned; none of its gaps spans the restart."""
        if self._store is None:
            return
        loaded = self._store.load_rhythms()
        for target, series in loaded.items():
            self._rhythms[target] = {k: r.resumed() for k, r in series.items()}
        if loaded:
            log.info("resumed the rhythm of %d series from the log",
                     sum(len(s) for s in loaded.values()))

    def of(self, target: str) -> dict[str, Rhythm]:
        return dict(self._rhythms.get(target, {}))

    def learn(self, target: str, view: TargetView) -> dict[str, Rhythm]:
        """The target's rhythms with the view folded in (also kept for the next cycle)."""
        learned = sw.learn_view(view, self._rhythms.get(target, {}))
        self._rhythms[target] = learned
        return learned

    def reach_s(self, target: str, th: Thresholds) -> float:
        """How far back the target's view must reach: three of its longest windows, as the
        keeper's view holds three fixed ones (a stall proven over one, with the progress
        before it that tells start-up from a learner that trained)."""
        return 3 * sw.longest_learned_s(self._rhythms.get(target, {}), th)

    def save(self, now: float) -> None:
        """Writes every rhythm, at most once per `save_every_s`."""
        if self._store is None or now - self._saved_at < self._save_every_s:
            return
        self._saved_at = now
        rows = [(t, k, r) for t, series in sorted(self._rhythms.items())
                for k, r in sorted(series.items())]
        self._store.save_rhythms(rows, now, now - FORGET_AFTER_S)
