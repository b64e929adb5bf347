// GENERATED from replaywatch/diagnosis/kinds.py by `python dashboards/mixin/build.py`: the critical
// kinds that page. Do not edit; declare a kind there.
[
  {
    kind: 'worker_starvation',
    summary: 'Learner starved by its batching workers: {{ $labels.target }} table {{ $labels.table }}',
    description: 'The learner reading table {{ $labels.table }} on {{ $labels.target }} has been blocked in next() while parallel batching workers hold samples that no batch completes; training has stopped. Evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'learner_stalled',
    summary: 'Learner update step hung: {{ $labels.target }} table {{ $labels.table }}',
    description: 'The learner takes no batch and no step although its iterator on table {{ $labels.table }} of {{ $labels.target }} has data: its update step hangs. The stacks are kept with the incident: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'warmup_impossible',
    summary: 'Table can never fill to min_size_to_sample: {{ $labels.target }} table {{ $labels.table }}',
    description: 'Table {{ $labels.table }} on {{ $labels.target }} holds at most max_size items, fewer than its min_size_to_sample: the learner can never sample and the job never starts training. Which number to change to what: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'writer_stalled',
    summary: 'Actor stuck in a Reverb writer call: {{ $labels.target }} table {{ $labels.table }}',
    description: 'An actor writing to table {{ $labels.table }} on {{ $labels.target }} has been inside create_item/flush/end_episode for the stall window while the limiter would accept its inserts (or the server is down): its writer or connection is stuck, not throttled. The call, how long and the items pending: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'sample_blocked',
    summary: 'Sampling blocked, inserts stopped: {{ $labels.target }} table {{ $labels.table }}',
    description: 'The rate limiter of table {{ $labels.table }} on {{ $labels.target }} refuses samples and no actor inserts: the actors are dead, stuck or too slow, and the learner waits. Evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'shard_not_sampled',
    summary: 'A shard nobody samples: {{ $labels.target }} table {{ $labels.table }}',
    description: 'Actors wait at max_diff on table {{ $labels.table }} of {{ $labels.target }} and nothing samples it, while the other servers of its job are sampled. Evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'insert_blocked',
    summary: 'Inserts blocked at max_diff, sampling stopped: {{ $labels.target }} table {{ $labels.table }}',
    description: 'Actors wait at max_diff on table {{ $labels.table }} of {{ $labels.target }} and the learner draws nothing: the learner stopped consuming. Evidence and the fix: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'batch_exceeds_headroom',
    summary: 'Configuration will hang the learner in next(): {{ $labels.target }} table {{ $labels.table }}',
    description: 'Once inserting stops, the rate limiter of table {{ $labels.table }} on {{ $labels.target }} releases fewer samples than one batch (or a policy-lag bound frees less than a batch a step): the learner will block in next() for good. The released samples and the fixes the budget model proves: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'priority_updates_rejected',
    summary: "Learner's priority updates all refused: {{ $labels.target }} table {{ $labels.table }}",
    description: 'Reverb refuses every priority update the learner sends to table {{ $labels.table }} on {{ $labels.target }} (NaN or negative priorities): the table samples by stale priorities. The error and the counts: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'rllib_actor_down',
    summary: 'RLlib actor down: {{ $labels.target }} {{ $labels.table }}',
    description: 'A Learner, or every EnvRunner, of RLlib {{ $labels.table }} on the Ray cluster {{ $labels.target }} is dead or restarting: training has stopped. The actors, their death causes and restarts: GET /api/v1/findings on the sidecar {{ $labels.instance }}.',
  },
  {
    kind: 'env_runner_stalled',
    summary: 'RLlib EnvRunner hung: {{ $labels.target }} {{ $labels.table }}',
    description: "An EnvRunner of RLlib {{ $labels.table }} on the Ray cluster {{ $labels.target }} has been inside one call for longer than its window, or samples nothing while the others do: its env hangs. Its pid, the call's age and the counters: GET /api/v1/findings on the sidecar {{ $labels.instance }}.",
  },
  {
    kind: 'driver_stalled',
    summary: 'RLlib driver stalled: {{ $labels.target }} {{ $labels.table }}',
    description: "Nothing of RLlib {{ $labels.table }} on the Ray cluster {{ $labels.target }} moves and no actor call runs: the driver waits, in its own learner or in the loop around train(). The driver's pid and the counters: GET /api/v1/findings on the sidecar {{ $labels.instance }}.",
  },
]
