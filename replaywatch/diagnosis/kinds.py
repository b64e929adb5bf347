"""Every finding kind, declared once: severity, whether it needs the probe, runbook, meaning, fix.

The rules build findings from these declarations (`case.finding(SAMPLE_BLOCKED, ...)`), the
engine takes its precedence and what supersedes what from them, and the alert, runbook and
docs tests read them. Adding a kind starts with its `Name` (replaywatch/model.py), one
`Kind(...)` here and its place in `ALL`; CONTRIBUTING.md lists the rest (its rule in its
family's `RULES`, the runbook, docs/findings.md's table; the alerts and the dashboard follow).

`ALL` is the precedence, worst first: severity first, then, within one severity, the finding
that names the more specific (or more certain) cause. A kind that supersedes another of its
severity on the same table comes before it; supersession itself is by presence, not by order,
so an info kind may stand a critical one down (`learner_starting` during start-up).

    for f in worst_first(findings): ...   # the one ordering of findings, everywhere
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from replaywatch.model import Finding, Name, Severity

RUNBOOKS = "docs/runbooks"


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of finding. `meaning` and `fix` are one line each (docs/findings.md, the page)."""

    name: Name
    severity: Severity
    needs_probe: bool
    meaning: str
    fix: str
    # Kinds this one replaces on the same table: the more specific cause wins.
    supersedes: tuple[Name, ...] = ()
    # A critical kind's page: (summary, description) of its Prometheus alert, in alert
    # template words ({{ $labels.target }}, {{ $labels.table }}, {{ $labels.instance }}).
    # Unsaid, they are made from its name and meaning (`page`).
    alert: tuple[str, str] | None = None

    @property
    def page(self) -> tuple[str, str]:
        """Its alert's summary and description (the mixin's alerts are built from these)."""
        if self.alert is not None:
            return self.alert
        where = "{{ $labels.target }} table {{ $labels.table }}"
        return (f"{self.name.replace('_', ' ').capitalize()}: {where}",
                f"On {where}: {self.meaning} Evidence and the fix: GET /api/v1/findings on "
                "the sidecar {{ $labels.instance }}.")

    @property
    def runbook(self) -> str:
        """Path of its runbook, relative to the repository root."""
        return f"{RUNBOOKS}/{self.name}.md"

    def finding(self, target: str, table: str, summary: str, evidence: dict[str, Any],
                fix: str, since: float, last_seen: float) -> Finding:
        """A finding of this kind, at its declared severity."""
        return Finding(self.name, self.severity, target, table, summary, evidence, fix,
                       since=since, last_seen=last_seen)


WORKER_STARVATION = Kind(
    # Proven by the trainer probe, or without it by two stack dumps (`--trainer-pid`).
    Name.WORKER_STARVATION, Severity.CRITICAL, needs_probe=False,
    meaning="A proven circular wait: the learner is blocked in `next()`, sampling stopped, the "
            "limiter allows no more samples, at least a batch was drawn but never delivered "
            "(parallel batching workers each hold part of one), and nothing will insert: a "
            "synchronous loop (the loop inserts), or actor probes showing every actor waiting "
            "on the learner. Needs the trainer probe, or `--trainer-pid` stacks of a "
            "synchronous loop inside `next()` (\"from stacks\").",
    fix="Synchronous loop: `num_parallel_calls=1`. Otherwise widen the limiter's slack (the "
        "finding computes the `error_buffer`) or loosen the actors' policy-lag bound.",
    # Starvation *is* a blocked sample with its cause named.
    supersedes=(Name.SAMPLE_BLOCKED,),
    alert=('Learner starved by its batching workers: {{ $labels.target }} table {{ '
           '$labels.table }}',
           'The learner reading table {{ $labels.table }} on {{ $labels.target }} has been '
           'blocked in next() while parallel batching workers hold samples that no batch '
           'completes; training has stopped. Evidence and the fix: GET /api/v1/findings on '
           'the sidecar {{ $labels.instance }}.'))
LEARNER_STALLED = Kind(
    Name.LEARNER_STALLED, Severity.CRITICAL, needs_probe=True,
    meaning="The iterator has data (ready, or the table can sample a batch) but the learner took "
            "no batch or step for the stall window: hung compute, e.g. a pmap deadlock. Needs "
            "the probe. RLlib (no probe): the learner's trained counter rests past its window "
            "while its Learner call runs on, or while env steps are still sampled.",
    fix="Look at the stored stacks (RLlib: `py-spy dump --pid` of the learner named).",
    alert=('Learner update step hung: {{ $labels.target }} table {{ $labels.table }}',
           'The learner takes no batch and no step although its iterator on table {{ '
           '$labels.table }} of {{ $labels.target }} has data: its update step hangs. The '
           'stacks are kept with the incident: GET /api/v1/findings on the sidecar {{ '
           '$labels.instance }}.'))
SAMPLE_BLOCKED = Kind(
    Name.SAMPLE_BLOCKED, Severity.CRITICAL, needs_probe=False,
    meaning="Sampling is blocked by the rate limiter and inserts stopped, and no circular wait "
            "is proven: actors dead, stuck or too slow (asynchronous), or a synchronous loop "
            "that no longer inserts. Where the layout is unknown the two readings stand side "
            "by side with what settles them (the loop's writer wrapped by the TrainerProbe, "
            "`--layout`, ActorProbe, `--trainer-pid` stacks).",
    fix="Restart or unblock the actors (synchronous: the loop); check their logs.",
    alert=('Sampling blocked, inserts stopped: {{ $labels.target }} table {{ $labels.table '
           '}}',
           'The rate limiter of table {{ $labels.table }} on {{ $labels.target }} refuses '
           'samples and no actor inserts: the actors are dead, stuck or too slow, and the '
           'learner waits. Evidence and the fix: GET /api/v1/findings on the sidecar {{ '
           '$labels.instance }}.'))
INSERT_BLOCKED = Kind(
    Name.INSERT_BLOCKED, Severity.CRITICAL, needs_probe=False,
    meaning="Inserts are blocked at `max_diff` and sampling stopped: the learner is not "
            "consuming.",
    fix="Find what the learner waits on (the stacks are in the incident).",
    alert=('Inserts blocked at max_diff, sampling stopped: {{ $labels.target }} table {{ '
           '$labels.table }}',
           'Actors wait at max_diff on table {{ $labels.table }} of {{ $labels.target }} '
           'and the learner draws nothing: the learner stopped consuming. Evidence and the '
           'fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.'))
SHARD_NOT_SAMPLED = Kind(
    Name.SHARD_NOT_SAMPLED, Severity.CRITICAL, needs_probe=False,
    meaning="A job shards its experience over several servers (one `job` label): this "
            "server's inserts wait at `max_diff` and nothing samples it, while the job's other "
            "servers go on being sampled. The learner does not read this server (its datasets "
            "list the others; said when the table was never sampled), or its reader of this "
            "server (a dataset, or a learner of its own) hangs or died while the others go on.",
    fix="Make the learner read every shard (a dataset per server address, interleaved), or "
        "stop writing to this one; where it read it before, find its reader's stack.",
    supersedes=(Name.INSERT_BLOCKED,),
    alert=('A shard nobody samples: {{ $labels.target }} table {{ $labels.table }}',
           'Actors wait at max_diff on table {{ $labels.table }} of {{ $labels.target }} and '
           'nothing samples it, while the other servers of its job are sampled. Evidence and '
           'the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.'))
WAITS_ON_SHARD = Kind(
    Name.WAITS_ON_SHARD, Severity.WARNING, needs_probe=False,
    meaning="A job shards its experience over several servers: this server's inserts wait at "
            "`max_diff` and nothing samples any of the job's servers, while another server of "
            "the job lets no sample through (below `min_size_to_sample`, or its cursor at "
            "`min_diff`) and takes no inserts. A learner that reads its shards in turn waits "
            "on that one; a learner that stopped reads the same from Reverb, and the "
            "learner's stack tells them apart.",
    fix="Fix the shard it waits on (its own finding says why its inserts stopped); this "
        "server is sampled again when the learner is.",
    supersedes=(Name.INSERT_BLOCKED,))
WRITER_STALLED = Kind(
    Name.WRITER_STALLED, Severity.CRITICAL, needs_probe=True,
    meaning="An actor has been inside a Reverb writer call (`create_item`, `flush`, "
            "`end_episode`, `append`) for the stall window while the limiter would accept "
            "inserts or the server is down: its writer, not the limiter, holds it (reverb#4, "
            "reverb#144). Needs the ActorProbe.",
    fix="Check the Reverb server and the actor's connection; restart its client; pass "
        "`timeout_ms` to `flush`/`end_episode`.",
    # The actor stuck in its writer is why inserts stopped and sampling is blocked.
    supersedes=(Name.SAMPLE_BLOCKED,),
    alert=('Actor stuck in a Reverb writer call: {{ $labels.target }} table {{ '
           '$labels.table }}',
           'An actor writing to table {{ $labels.table }} on {{ $labels.target }} has been '
           'inside create_item/flush/end_episode for the stall window while the limiter '
           'would accept its inserts (or the server is down): its writer or connection is '
           'stuck, not throttled. The call, how long and the items pending: GET '
           '/api/v1/findings on the sidecar {{ $labels.instance }}.'))
BATCH_EXCEEDS_HEADROOM = Kind(
    Name.BATCH_EXCEEDS_HEADROOM, Severity.CRITICAL, needs_probe=True,
    meaning="The budget model's `will_hang`, with the layout known (probe, loop writer or "
            "`--layout`) and a synchronous loop's gate known (declared, learned from its "
            "`next()` calls) or hanging under either: when the learner asks, the limiter has "
            "released fewer samples than one batch (or a bound frees less than a batch a "
            "step), so the learner will block in `next()` for good. Judged on the first poll, "
            "before the first `next()`.",
    fix="Apply one of the fixes the finding lists (each proven by the model).",
    # A batch that never fits is the certain form of the predicted risk.
    supersedes=(Name.DEADLOCK_RISK,),
    alert=('Configuration will hang the learner in next(): {{ $labels.target }} table {{ '
           '$labels.table }}',
           'Once inserting stops, the rate limiter of table {{ $labels.table }} on {{ '
           '$labels.target }} releases fewer samples than one batch (or a policy-lag bound '
           'frees less than a batch a step): the learner will block in next() for good. '
           'The released samples and the fixes the budget model proves: GET '
           '/api/v1/findings on the sidecar {{ $labels.instance }}.'))
WARMUP_IMPOSSIBLE = Kind(
    Name.WARMUP_IMPOSSIBLE, Severity.CRITICAL, needs_probe=False,
    meaning="The table can never hold `min_size_to_sample` items (`max_size < "
            "min_size_to_sample`): inserts flow, the learner never gets a sample. Judged from "
            "the configuration on the first poll.",
    fix="Raise `max_size` to at least `min_size_to_sample`, or lower `min_size_to_sample` "
        "(Acme: `min_replay_size`) to at most `max_size` (values given).",
    # A table that cannot fill is not filling up, and its blocked sampling has this cause.
    supersedes=(Name.SAMPLE_BLOCKED, Name.WARMUP),
    alert=('Table can never fill to min_size_to_sample: {{ $labels.target }} table {{ '
           '$labels.table }}',
           'Table {{ $labels.table }} on {{ $labels.target }} holds at most max_size '
           'items, fewer than its min_size_to_sample: the learner can never sample and the '
           'job never starts training. Which number to change to what: GET '
           '/api/v1/findings on the sidecar {{ $labels.instance }}.'))
PRIORITY_UPDATES_REJECTED = Kind(
    # Declared critical for its page; a finding where only some calls were refused is a
    # warning (rules_health.py), and the page's expression reads the finding's severity.
    Name.PRIORITY_UPDATES_REJECTED, Severity.CRITICAL, needs_probe=True,
    meaning="Reverb refused the learner's priority updates (its trainer probe counts the "
            "wrapped client's `mutate_priorities` calls that raised): a NaN or negative "
            "priority is refused, and the rest of that call with it. Critical when every call "
            "over the stall window (three at least) was refused: no priority lands and the "
            "table samples by stale ones; a warning when some were.",
    fix="Send finite priorities >= 0: find where the TD error turns NaN (a diverged loss) "
        "and use its absolute value; clip before sending.",
    alert=("Learner's priority updates all refused: {{ $labels.target }} table "
           "{{ $labels.table }}",
           "Reverb refuses every priority update the learner sends to table {{ $labels.table "
           "}} on {{ $labels.target }} (NaN or negative priorities): the table samples by "
           "stale priorities. The error and the counts: GET /api/v1/findings on the sidecar "
           "{{ $labels.instance }}."))
TARGET_DOWN = Kind(
    Name.TARGET_DOWN, Severity.WARNING, needs_probe=False,
    meaning="The Reverb server did not answer for more than `down_polls` (2) polls.",
    fix="Is the job alive? Is the address right?")
PROBE_DOWN = Kind(
    Name.PROBE_DOWN, Severity.WARNING, needs_probe=True,
    meaning="A trainer or actor probe did not answer for more than `down_polls` (2) polls.",
    fix="Is the process alive and serving its probe? Is the address right? (A silent actor "
        "probe is often a dead actor.)")
DEADLOCK_RISK = Kind(
    Name.DEADLOCK_RISK, Severity.WARNING, needs_probe=True,
    meaning="The budget model's `can_hang`, predicted from the configuration before any hang: "
            "the samples the limiter releases once inserting stops fit in what the batching "
            "workers can hold without completing a batch. With the layout unknown (only where "
            "insert blocking is disabled), its synchronous reading, beside the asynchronous one; "
            "with a loop's gate unknown, the worse of its can_sample and scheduled readings "
            "(a `will_hang` only on a schedule is a risk until the loop's calls settle it).",
    fix="Apply one of the fixes the finding lists (each proven by the model), before it "
        "hangs; `replaywatch predict` gives the same before the job starts.")
SPI_DRIFT = Kind(
    Name.SPI_DRIFT, Severity.WARNING, needs_probe=False,
    meaning="Observed samples per insert stays off the configured ratio by more than the "
            "limiter's tolerance. RLlib: env steps trained per env step sampled (the counters) "
            "off `training_intensity` by more than 10 % after warm-up.",
    fix="Check actor/learner speeds and the limiter.")
STALE_DATA = Kind(
    Name.STALE_DATA, Severity.WARNING, needs_probe=False,
    meaning="Inserts stopped for the stall window while sampling continues (a `MinSize` "
            "limiter or a wide `SampleToInsertRatio` window never blocks the learner): it "
            "trains on a frozen table.",
    fix="Restart the actors (they are dead or stuck); check their logs.")
THROUGHPUT_DROP = Kind(
    Name.THROUGHPUT_DROP, Severity.WARNING, needs_probe=False,
    meaning="A table's insert or sample rate, or an actor's steps per second (ActorProbe), "
            "stayed below its own baseline (the median of 10 s rates over the last 30 min, "
            "band at least +-50 %): over the last `throughput_drop_for_s` (300 s) its rate "
            "and its median moving 10 s rate below half, or over a fifth of that below a "
            "fifth, while something still moves. Says whether the "
            "server (its time per insert grew) or the clients are slower.",
    fix="Server slower: check the replay host. Clients slower: the actors' environment "
        "step or writer time (evidence), or the learner's step.")
TOO_MANY_THREADS = Kind(
    Name.TOO_MANY_THREADS, Severity.WARNING, needs_probe=True,
    meaning="The trainer runs more threads than the threshold, counted by the OS "
            "(`/proc/self/task`: tf.data, Reverb samplers, gRPC), else by Python; the seed's "
            "job had over 500.",
    fix="Fewer parallel calls / prefetch threads.")
LEARNER_STARTING = Kind(
    Name.LEARNER_STARTING, Severity.INFO, needs_probe=False,
    meaning="No learner has finished its first step yet (probe: no step or no second batch; "
            "Reverb alone: beyond one fill of the pipeline, no sampling the learner paced "
            "over 4 polls nor moving for a stall window), so blocked inserts or an idle "
            "learner are start-up (a first jit compile can take minutes), for up to "
            "`startup_grace_s` (900 s), and for one stall window after the first step is "
            "seen (the counters rested through start-up: a stall is timed from the first "
            "step). A hang at the first step is caught when the grace ends.",
    fix="Wait; if it outlasts the grace it becomes the usual critical finding.",
    # Start-up explains these on the same table while the grace lasts (an info kind winning
    # over critical ones: the engine's supersession ignores severity).
    supersedes=(Name.LEARNER_STALLED, Name.SAMPLE_BLOCKED, Name.INSERT_BLOCKED))
CHECKPOINTING = Kind(
    Name.CHECKPOINTING, Severity.INFO, needs_probe=False,
    meaning="The Reverb server answers no ServerInfo call (nor, on a new channel, the "
            "connection) in time and refuses none, for less than `checkpoint_grace_s` (60 s): "
            "its table lock is held, as a checkpoint holds it while it copies every item "
            "(`client.checkpoint()`), or as a hung server does. Writers held meanwhile are "
            "held by the pause, not `writer_stalled`, and probes that went unanswered with "
            "it are held too, not `probe_down` (evidence `probes_held`). Past the grace it "
            "is `target_down`; clients held meanwhile are `reconnecting` once it answers. "
            "With a ReplayProbe handed the server, also a checkpoint the probe sees written "
            "(`probe.checkpoint(client)`), with its duration so far against the previous "
            "ones: Reverb writes it while the server answers (a 1 GiB table: 25 s), and a "
            "pause that began during it is held while it lasts. It says what the write keeps "
            "alive: every item removed from a table while it runs stays in memory until it "
            "ends (memory_exhaustion when that passes the limit).",
    fix="Nothing, if a checkpoint is running; if it lasts, look at the replay process.",
    # A server that is busy, not gone.
    supersedes=(Name.TARGET_DOWN,))
RESTORING = Kind(
    Name.RESTORING, Severity.INFO, needs_probe=True,
    meaning="The replay process is loading a checkpoint inside `reverb.Server(...)`, whose "
            "port serves only once the load ends (minutes for a large table; reverb#147): "
            "its ReplayProbe, handed the server (`probe.server(...)`), answers meanwhile with "
            "the checkpoint's size and what the process has read of it, hence a rate and an "
            "ETA. Not `target_down`. Without that probe a restore reads as `target_down`.",
    fix="Wait; if read_bytes stops growing, take the replay process's stacks.",
    # A server that loads, not one that is gone.
    supersedes=(Name.TARGET_DOWN,))
RECONNECTING = Kind(
    Name.RECONNECTING, Severity.INFO, needs_probe=False,
    meaning="The Reverb server came back, restarted or restored less than "
            "`reconnect_grace_s` (30 s) ago, and its clients are still reconnecting (gRPC's "
            "back-off: about 12 s after a stop); or the same server answered again after an "
            "outage less than a stall window ago, which still spans the dark time (its "
            "clients go on at once). An actor inside its writer call, stopped inserts or "
            "sampling are the coming back, shown with it as their cause. Past the grace "
            "they are the usual findings.",
    fix="Wait; if it outlasts the grace it becomes the usual finding.",
    # A restart explains these on the same table while its clients reconnect.
    supersedes=(Name.WORKER_STARVATION, Name.LEARNER_STALLED, Name.WRITER_STALLED,
                Name.SAMPLE_BLOCKED, Name.INSERT_BLOCKED, Name.STALE_DATA))
SERVER_RESTARTED = Kind(
    Name.SERVER_RESTARTED, Severity.INFO, needs_probe=False,
    meaning="The Reverb server was replaced under the same address (counters went back) or "
            "restored from a checkpoint; shown with the counters before and after, never as a "
            "stall or a negative rate.",
    fix="Nothing, if the restart was intended; a restored limiter says how many inserts "
        "unblock it.")
DRAINED = Kind(
    Name.DRAINED, Severity.INFO, needs_probe=False,
    meaning="A queue table (`reverb.Table.queue`) is empty at most polls while items move "
            "through it: the learner is faster than the actors (how much faster, from the "
            "table worker's time waiting for inserts). Not warm-up, not a stall.",
    fix="Nothing to fix; more actors (or faster environment steps) train faster.",
    # An empty queue is below min_size_to_sample; drained by a learner, it is not filling.
    supersedes=(Name.WARMUP,))
DECLARED_PIPELINE_DIFFERS = Kind(
    Name.DECLARED_PIPELINE_DIFFERS, Severity.INFO, needs_probe=True,
    meaning="The trainer probe declares a dataset value (`batch_size`, `num_parallel_calls`, "
            "`max_in_flight`, `iterators_per_worker`, `batch_after_interleave`, "
            "`cycle_length`) that the pipeline it read from the tf.data graph contradicts: "
            "the read value is what every verdict uses, the declared one is shown beside it.",
    fix="Correct the declaration or leave it out (the probe reads the pipeline itself); the "
        "verdicts already use the read values.")
MEMORY_EXHAUSTION = Kind(
    Name.MEMORY_EXHAUSTION, Severity.WARNING, needs_probe=False,
    meaning="The replay server's process will not fit: its table filled to `max_size` (an item's "
            "bytes measured from the process's memory against `current_size` as it fills) "
            "takes it past its memory limit (its cgroup's, else the host's). Named while the "
            "table fills, with the time left at its insert rate (the soonest the readings "
            "allow, and its range); needs the server's host (a local target, `--reverb-pid`). "
            "Also a full table whose checkpoint, written as long as the longest of the last "
            "three, keeps enough removed items alive to take the process past its limit "
            "(cause `checkpoint`: Reverb holds what it copied until the write ends). A "
            "job's servers under one limit (one host's memory, one cgroup's: `limit_scope`) "
            "are judged together: their memory now and what each table still filling adds, "
            "its item read from its own process (evidence `shares_limit_with`, `servers`). On "
            "RLlib, the driver whose replay buffer, filled to its capacity, takes it past "
            "its limit, or whose cgroup OOM-kills while it fills or once it is full (an env "
            "step's bytes measured from the driver's memory as it fills; needs the "
            "RLlibProbe; the capacity given fits under 85% of the limit as projected).",
    fix="Lower `max_size` (RLlib: `replay_buffer_config['capacity']`) to the value given "
        "(it fits under 90% of the limit; for servers sharing a limit, each server's), or "
        "give shards a limit each, or raise the limit to the value given.")
CHECKPOINT_FAILED = Kind(
    Name.CHECKPOINT_FAILED, Severity.WARNING, needs_probe=True,
    meaning="The replay's checkpoints do not reach its directory: the newest "
            "`probe.checkpoint(client)` raised (a read-only or full disk), a checkpoint an "
            "earlier process began has no DONE file (a restart during the write), or none "
            "completed within the interval the code said (`checkpoint_every_s`) plus twice "
            "the last write. A restart then loses what was inserted since the last one.",
    fix="Make the checkpoint directory writable with room for a checkpoint, and read the "
        "write's error in the replay process's log.")
CHECKPOINT_UNRESTORABLE = Kind(
    Name.CHECKPOINT_UNRESTORABLE, Severity.WARNING, needs_probe=True,
    meaning="The server checkpoints into the directory of Reverb's default checkpointer, a "
            "fresh temporary one each time a process starts it (`reverb.Server` without "
            "`checkpointer=`, and distributed Acme's replay node): a restarted replay process "
            "looks in a new, empty directory and starts empty, so its checkpoints are never "
            "restored. Named before the first restart, once the code checkpoints.",
    fix="Pass `checkpointer=reverb.checkpointers.DefaultCheckpointer(path=...)` with a "
        "directory that outlives the process.")
RESTORE_CONFIG_OVERRIDE = Kind(
    Name.RESTORE_CONFIG_OVERRIDE, Severity.WARNING, needs_probe=True,
    meaning="A table serves settings its code did not write: a restore loads the "
            "checkpoint's sampler, remover, max_size, max_times_sampled and rate limiter "
            "(with its counters) over the code's `reverb.Table` (reverb#137, reverb#134). "
            "Each changed setting is named with both values, and a restored limiter that "
            "blocks sampling with the inserts it waits for.",
    fix="Start on a directory without that checkpoint to run the code's settings, or write "
        "the served settings into the code to keep the items.")
SHARD_CONFIG_DIFFERS = Kind(
    Name.SHARD_CONFIG_DIFFERS, Severity.WARNING, needs_probe=False,
    meaning="A job shards its experience over several servers (one `job` label) and a table "
            "of the same name is not the same table on all of them: a rate limiter "
            "(`samples_per_insert`, `min_size_to_sample`, `min_diff`, `max_diff`), `max_size`, "
            "`max_times_sampled`, sampler or remover differs. Named on the servers whose "
            "setting is not the one most of them serve (on each of them when no value is), "
            "each differing setting with its value here and on the others. The job's replay "
            "ratio is then a mix of the shards', not the one its code asks for.",
    fix="Start every shard from the same `reverb.Table` (one code path, one config); a "
        "server restored from a checkpoint serves the checkpoint's settings "
        "(restore_config_override).")
MEMORY_LEAK = Kind(
    Name.MEMORY_LEAK, Severity.WARNING, needs_probe=False,
    meaning="The replay server's memory rose through five minutes or more while every table "
            "was full (or its size flat): not its items. Read from the lows of its memory (a "
            "full table's memory is a saw: freed items are released on the next insert call). "
            "With ActorProbes it says whether an actor's writer keeps its episode's chunks "
            "alive (an episode that never ends under a large `num_keep_alive_refs`) or the "
            "server grows on its own; without, both. Not while a checkpoint its replay probe "
            "reports is written (the write keeps removed items alive: memory_exhaustion).",
    fix="End episodes or lower `num_keep_alive_refs` where a writer holds them; else restart "
        "the replay from a checkpoint before the time left.")
PRIORITIES_IGNORED = Kind(
    Name.PRIORITIES_IGNORED, Severity.WARNING, needs_probe=True,
    meaning="The learner sends priority updates (counted by its trainer probe on the client it "
            "wraps, `probe.wrap_client(client, inserts=False)`) to a table whose sampler and "
            "remover read no priority (Uniform, Fifo, Lifo, from ServerInfo): every update is "
            "kept and changes no sample (acme#69).",
    fix="Give the table a `Prioritized` sampler, or stop sending priorities.")
REPEATED_BATCHES = Kind(
    Name.REPEATED_BATCHES, Severity.WARNING, needs_probe=True,
    meaning="The learner took a batch whose keys are exactly those of one of its last 16 "
            "batches (its trainer probe reads each batch's SampleInfo off the learner's "
            "thread): a cache or a prefetch yields a batch again and it trains on the same "
            "samples twice (acme#293).",
    fix="Take each batch from the Reverb dataset once: no `.cache()`/`.repeat()` after it, "
        "no iterator that yields a kept batch again.")
PRIORITY_COLLAPSE = Kind(
    Name.PRIORITY_COLLAPSE, Severity.WARNING, needs_probe=True,
    meaning="On a prioritized table the sampler draws from under 1% of the items (the "
            "effective sample size of the batches' probabilities, 1 / mean probability) for "
            "10 s, or a batch carried an infinite priority (Reverb accepts +inf).",
    fix="Bound the priorities sent (clip the TD error, cap them, never +inf or NaN), or lower "
        "the priority exponent.")
WASTED_EXPERIENCE = Kind(
    Name.WASTED_EXPERIENCE, Severity.WARNING, needs_probe=False,
    meaning="More than half of the items a full table evicted while it stayed full (two "
            "turnovers, 2 x max_size inserts, and 60 s at least) were never sampled "
            "(ServerInfo's `num_unique_samples` against its inserts). A uniform, "
            "oldest-first table wastes e^-s at s samples per insert whatever its max_size; "
            "more is inserts in bursts longer than the table (a collect loop, actors "
            "inserting while the learner pauses), or on a prioritized table its priorities, "
            "and it says which. On RLlib (with the RLlibProbe), estimated as e^-s from the "
            "driver's replay buffer's env steps sampled per env step added while it stays "
            "full (RLlib counts no step's draws; a floor on a prioritized buffer).",
    fix="Too few samples per insert: sample at least 1 per insert (a `SampleToInsertRatio` "
        "limiter) or insert less. Bursts: `max_size` above the burst it gives, or shorter "
        "bursts. RLlib: the training_intensity given.")
IN_SECTION = Kind(
    Name.IN_SECTION, Severity.INFO, needs_probe=False,
    meaning="A learner (or every actor) is inside a section its code marks "
            "(`with probe.section(\"evaluate\"):`) for longer than the stall window: the "
            "stall rules wait for the section's `timeout_s`, else its learned length (1.5 x "
            "its longest), else `startup_grace_s`, and say which.",
    fix="Nothing while it lasts; give the section a `timeout_s` to bound the wait. Past it, "
        "the usual stall is named.")
PIPELINE_DRAINING = Kind(
    Name.PIPELINE_DRAINING, Severity.INFO, needs_probe=False,
    meaning="Inserts wait at max_diff and the table has rested longer than its own rhythm "
            "while the learner lives on samples its pipeline drew before (a deep prefetch, "
            "several batching workers): its trainer probe shows it taking batches, or, from "
            "Reverb alone, the most samples its pipeline drew at once last it that long. The "
            "stall rules wait, and say until when.",
    fix="Nothing while the learner trains. Past the window the usual stall is named; a "
        "trainer probe judges by the learner's own batches, much sooner than Reverb alone.")
RLLIB_ACTOR_DOWN = Kind(
    # Declared critical for its page: a Learner down, or every EnvRunner, stops training. A
    # finding where only some EnvRunners (or an aggregator) are down is said as a warning
    # (rules_rllib.py): RLlib samples on with the others, slower.
    Name.RLLIB_ACTOR_DOWN, Severity.CRITICAL, needs_probe=False,
    meaning="An RLlib job's EnvRunner, Learner or aggregator actor is DEAD or RESTARTING, or "
            "restarted within the look-back (Ray's state API; an actor its owner ended, as "
            "`algo.stop()` ends them by `ray.kill`, by letting go of its handle or by "
            "exiting, or with its driver, is not down). Critical when a Learner or every "
            "EnvRunner is down (nothing trains), a warning when some EnvRunners are (how many "
            "of how many in evidence).",
    fix="Read the death cause given, then the dead actor's log (the Ray session's logs/ "
        "files named with its pid) for the exception; RLlib recreates failed EnvRunners under "
        "`fault_tolerance(restart_failed_env_runners=True)`.",
    alert=("RLlib actor down: {{ $labels.target }} {{ $labels.table }}",
           "A Learner, or every EnvRunner, of RLlib {{ $labels.table }} on the Ray cluster {{ "
           "$labels.target }} is dead or restarting: training has stopped. The actors, their "
           "death causes and restarts: GET /api/v1/findings on the sidecar {{ "
           "$labels.instance }}."),
    # Actors that died explain why nothing moves.
    supersedes=(Name.DRIVER_STALLED, Name.ENV_RUNNER_STALLED))
ENV_RUNNER_STALLED = Kind(
    Name.ENV_RUNNER_STALLED, Severity.CRITICAL, needs_probe=False,
    meaning="An RLlib EnvRunner's call (`SingleAgentEnvRunner.apply`) runs past the window "
            "learned from its earlier calls and the sampled counter's rhythm, or (asynchronous "
            "sampling, APPO) its sampled counter rests past its window while the other "
            "runners' move: its env hangs. In DQN sampling is synchronous, so it stops the "
            "whole job (RLlib's `sample_timeout_s` lets the other runners' steps through once "
            "a minute).",
    fix="`py-spy dump --pid` of the runner named: its stack shows the env call that hangs.",
    alert=("RLlib EnvRunner hung: {{ $labels.target }} {{ $labels.table }}",
           "An EnvRunner of RLlib {{ $labels.table }} on the Ray cluster {{ $labels.target "
           "}} has been inside one call for longer than its window, or samples nothing while "
           "the others do: its env hangs. Its pid, the call's age and the counters: GET "
           "/api/v1/findings on the sidecar {{ $labels.instance }}."))
DRIVER_STALLED = Kind(
    Name.DRIVER_STALLED, Severity.CRITICAL, needs_probe=False,
    meaning="An RLlib job where no progress series moves (env steps sampled and trained, "
            "iterations, training steps, result rows), each past its own window, and no actor "
            "call runs: the wait is in the driver, either its learner (`num_learners=0`, "
            "RLlib's default, trains in the driver) or the user's loop around `algo.train()`. "
            "The driver's stack tells which, or an RLlibProbe in the driver: its learner "
            "thread not waiting for input (hung in its update) or blocked on an empty "
            "in-queue (the driver waits elsewhere).",
    fix="`py-spy dump --pid` of the driver named: a learner's `update` on its stack is the "
        "learner, anything else the loop around `train()`.",
    alert=("RLlib driver stalled: {{ $labels.target }} {{ $labels.table }}",
           "Nothing of RLlib {{ $labels.table }} on the Ray cluster {{ $labels.target }} "
           "moves and no actor call runs: the driver waits, in its own learner or in the "
           "loop around train(). The driver's pid and the counters: GET /api/v1/findings on "
           "the sidecar {{ $labels.instance }}."))
ENV_STEPS_DROPPED = Kind(
    Name.ENV_STEPS_DROPPED, Severity.WARNING, needs_probe=False,
    meaning="An RLlib job dropped sampled env steps within the look-back: its circular "
            "buffer's or its training step's drop counters, or the result rows' "
            "`learner_group_ts_dropped_lifetime` or aggregators' dropped steps, rose (how "
            "many, per second, and their share of the steps sampled since they began, or "
            "over the last `spi_window_s` where longer: a healthy phase before them does not "
            "dilute it). The learner takes less than is sampled. A warning from "
            "`dropped_share` (25 %) of the steps sampled; "
            "below it, info: an asynchronous learner's circular buffer overwrites what its "
            "learner did not take by design (a healthy APPO dropped 5 to 7 % here).",
    fix="If the learner is stalled, that is the cause. Otherwise fewer EnvRunners or more "
        "learners (`num_learners`) bring sampling into line with learning.")
WARMUP = Kind(
    Name.WARMUP, Severity.INFO, needs_probe=False,
    meaning="Below `min_size_to_sample` while inserts progress. Not a stall. RLlib: fewer env "
            "steps sampled than `num_steps_sampled_before_learning_starts` (or no update yet) "
            "while sampling moves.",
    fix="Wait.")

# Precedence, worst first.
ALL: tuple[Kind, ...] = (
    WORKER_STARVATION, LEARNER_STALLED, WARMUP_IMPOSSIBLE, WRITER_STALLED, SAMPLE_BLOCKED,
    SHARD_NOT_SAMPLED, INSERT_BLOCKED, BATCH_EXCEEDS_HEADROOM, PRIORITY_UPDATES_REJECTED,
    RLLIB_ACTOR_DOWN, ENV_RUNNER_STALLED, DRIVER_STALLED,
    TARGET_DOWN, PROBE_DOWN, WAITS_ON_SHARD, DEADLOCK_RISK, MEMORY_EXHAUSTION,
    CHECKPOINT_FAILED, CHECKPOINT_UNRESTORABLE, RESTORE_CONFIG_OVERRIDE, SHARD_CONFIG_DIFFERS,
    MEMORY_LEAK, PRIORITY_COLLAPSE, PRIORITIES_IGNORED, REPEATED_BATCHES, WASTED_EXPERIENCE,
    ENV_STEPS_DROPPED, SPI_DRIFT, STALE_DATA, THROUGHPUT_DROP,
    TOO_MANY_THREADS,
    LEARNER_STARTING, CHECKPOINTING, RESTORING, RECONNECTING, SERVER_RESTARTED, DRAINED, WARMUP,
    DECLARED_PIPELINE_DIFFERS, IN_SECTION, PIPELINE_DRAINING,
)
BY_NAME: dict[str, Kind] = {k.name: k for k in ALL}


def precedence(kind: str) -> int:
    """Rank of a kind in `ALL` (0 is worst); a kind no longer declared (an old incident) last."""
    return next((i for i, k in enumerate(ALL) if k.name == kind), len(ALL))


def worst_first(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """The one ordering of findings: severity, then precedence, then oldest, then place."""
    return tuple(sorted(findings, key=lambda f: (-f.severity, precedence(f.kind), f.since,
                                                 f.target, f.table)))


def superseded_by(kind: str) -> tuple[str, ...]:
    """The kinds that replace `kind` when both hold on the same table."""
    return tuple(k.name for k in ALL if kind in k.supersedes)


def markdown_table() -> str:
    """docs/findings.md's finding table, one row per kind in precedence order."""
    rows = ["| kind | severity | means | typical fix |", "| --- | --- | --- | --- |"]
    rows += [f"| `{k.name}` | {k.severity.label} | {k.meaning} | {k.fix} |" for k in ALL]
    return "\n".join(rows)
