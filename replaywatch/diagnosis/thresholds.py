"""The named numbers every rule is judged by, validated once at construction."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """Defaults suit a 1 s poll: a stall is named after 10 s without progress."""

    stall_window_s: float = 10.0  # no progress for this long is a stall
    down_polls: int = 2  # failed polls in a row before target_down / probe_down
    spi_window_s: float = 60.0  # observed samples per insert (and waste) is judged over this
    spi_min_inserts: int = 50  # too few inserts make the observed ratio noise
    too_many_threads: int = 500  # the seed's job ran over 500 threads
    min_history_s: float = 3.0  # shorter history is "insufficient data"
    # A learner's first step (a jit compile) may take minutes (acme#212: 20); until then
    # blocked inserts and an idle learner are learner_starting, for at most this long. A
    # 10-minute compile ends ~10 min 10 s after the process starts (start-up and the first
    # fill come first): 600 s paged it as learner_stalled in make bench-long.
    startup_grace_s: float = 900.0
    # Reverb's clients take seconds to reconnect after a restart or an outage (gRPC's
    # back-off: about 12 s after a stop, however short the dark time); for this long after
    # the server is back, the stalls that explains are `reconnecting`, not pages.
    reconnect_grace_s: float = 30.0
    # A server that answers no call in time and refuses none (its table lock held) is
    # `checkpointing` for this long, then target_down: Reverb copies every item under the
    # lock (~2.7 us an item on Reverb 0.14), and a 2-minute checkpoint interval paged
    # target_down here.
    checkpoint_grace_s: float = 60.0
    # throughput_drop: a rate against its own baseline, the median of 10 s rates over this
    # look-back (at least `throughput_min_baseline_s` of them), and how long it must stay
    # below half of it to be a drop (below a fifth: a fifth of this).
    throughput_baseline_s: float = 1800.0
    throughput_min_baseline_s: float = 180.0
    throughput_drop_for_s: float = 300.0
    # The stall window learned from the job's rhythm (diagnosis/rhythm.py): k x the longest
    # normal gap between progress, never below stall_window_s; a pause seen before and due
    # now gets pause_slack x the longest seen. Off (pinned): stall_window_s alone.
    learned_windows: bool = True
    window_factor: float = 3.0
    pause_slack: float = 1.5
    # env_steps_dropped pages (warning) from this share of the env steps sampled over its
    # look-back; below it, it is said (info). An asynchronous learner's circular buffer
    # overwrites what its learner did not take by design: a healthy default APPO on 2 cores
    # dropped 5 to 7 %.
    dropped_share: float = 0.25

    def __post_init__(self) -> None:
        for name in ("stall_window_s", "spi_window_s", "min_history_s", "startup_grace_s",
                     "reconnect_grace_s", "checkpoint_grace_s", "throughput_baseline_s",
                     "throughput_min_baseline_s", "throughput_drop_for_s", "window_factor",
                     "pause_slack", "dropped_share"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} ({value!r}) must be > 0")
        if not isinstance(self.learned_windows, bool):
            raise ValueError(f"learned_windows ({self.learned_windows!r}) must be true or false")
        if self.dropped_share > 1:
            raise ValueError(f"dropped_share ({self.dropped_share!r}) must be <= 1")
        for name in ("window_factor", "pause_slack"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)!r}) must be >= 1")
        for name in ("down_polls", "spi_min_inserts", "too_many_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1")
        if self.min_history_s > self.stall_window_s:
            raise ValueError(
                f"min_history_s ({self.min_history_s}) must be <= stall_window_s "
                f"({self.stall_window_s})"
            )
        if self.throughput_min_baseline_s > self.throughput_baseline_s:
            raise ValueError(
                f"throughput_min_baseline_s ({self.throughput_min_baseline_s}) must be <= "
                f"throughput_baseline_s ({self.throughput_baseline_s})"
            )

    @property
    def throughput_lookback_s(self) -> float:
        """History the throughput rule reads: the baseline and the span it judges."""
        return self.throughput_baseline_s + self.throughput_drop_for_s

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]
