"""Probes: what only the trainer, actor and replay processes know, served over HTTP.

Standard library only: a probe must be importable next to any trainer or
actor without pulling TensorFlow, JAX, Reverb, Acme or a web framework.
Read-only: no endpoint changes the process. Each probe serves `GET /probe`
(a JSON document whose `role` is "trainer", "actor" or "replay") and `GET /stacks`
(every Python thread's stack) from a daemon thread, so it answers while the
process's own loop is stuck.

The learner, plain tf.data loop (wrap the iterator the loop calls `next()` on):

    from replaywatch.probe import TrainerProbe
    probe = TrainerProbe(batch_size=256, num_parallel_calls=12, name="learner")
    iterator = probe.wrap(iterator)
    port = probe.start()        # GET /probe, GET /stacks on 127.0.0.1:port
    ...
    probe.step()                # optional learner-step heartbeat

The learner, Acme (LocalLayout, `run_experiment`): wrap the builder once; the
learner it makes gets its own iterator (above `utils.prefetch`, so `ready()`
and each `next()` of the learner's `step()` are seen) and `step()` counted:

    probe = TrainerProbe(batch_size=256, num_parallel_calls=12, name="learner")
    probe.start()
    builder = probe.wrap_builder(td3.TD3Builder(config))   # same builder object
    experiments.run_experiment(experiments.ExperimentConfig(builder=builder, ...))
    # or, with a learner in hand: learner = probe.wrap_learner(learner)

An actor:

    from replaywatch.probe import ActorProbe
    probe = ActorProbe(table="replay", name="actor-0", listen="127.0.0.1:0")
    writer = probe.wrap_writer(writer)  # reverb.TrajectoryWriter or reverb.Writer
    # or, where writers are made for you (Acme's adders), wrap the client they come from:
    # adder = builder.make_adder(probe.wrap_client(replay_client), ...)
    with probe.waiting("learner"):      # waits outside Reverb: parameters, policy lag
        ...
    probe.step()                        # one environment step (heartbeat)
    port = probe.start()
    probe.stop()

The replay server, where the sidecar cannot read its host (replay.py):

    from replaywatch.probe import ReplayProbe
    ReplayProbe(listen="0.0.0.0:8002").start()  # in the process that runs reverb.Server

An RLlib driver (rllib.py: the replay buffer, the learner thread's queue, the newest row),
attached through the config's callbacks and read by `watch --ray ... --ray-results URL`:

    from replaywatch.probe import RLlibProbe
    probe = RLlibProbe(listen="0.0.0.0:8003")
    config = config.callbacks(**probe.callbacks())

Every document carries `role`, `pid`, `name`, `table`, `started_at`, `now` (wall
clock, seconds), `thread_count` (Python threads) and `os_threads` (the
process's OS threads from /proc/self/task; null off Linux). The rest of each
is listed at `TrainerProbe.snapshot`, `ActorProbe.snapshot` and `ReplayProbe.snapshot`.
"""

from replaywatch.probe.actor import ActorProbe
from replaywatch.probe.replay import ReplayProbe
from replaywatch.probe.rllib import RLlibProbe
from replaywatch.probe.trainer import TrainerProbe

__all__ = ["ActorProbe", "RLlibProbe", "ReplayProbe", "TrainerProbe"]
