"""A real RLlib job on CartPole-v1, the RLlib tier's workload: run by .venv-rllib's Python only.

DQN with its replay buffer, or APPO, on RLlib's new API stack (the default in Ray 2.60), in a
plain `algo.train()` loop. Faults are switched on by flags, nothing else in the job changes:
`--hang-env-after N` sleeps forever in the N+1-th `step()` of one EnvRunner's environment
(`--hang-env-runner`, 0 for every runner), `--hang-learner-after N` sleeps forever in the
Learner's N+1-th `compute_losses` (in the Learner actor with `--num-learners 1`; in APPO that
is its `_LearnerThread`), `--learner-step-s S` makes every update S seconds longer (once
`--learner-slow-after-s` have passed since its first: a healthy phase first).
`--probe-listen HOST:PORT` attaches replaywatch's RLlibProbe through the config's callbacks,
the one change a user makes for it.

Ray 2.60 writes no result.json in a plain `algo.train()` loop: `Trainable.log_result` does
nothing and `algo.logdir` is an empty directory under ~/ray_results (only Tune's
JsonLoggerCallback writes one). This job writes each iteration's row there itself, as Tune
does (one JSON object a line, `result.json`; the config in `params.json`), so a reader finds
the rows where a Tune run keeps them.

It joins the cluster at `--address` (one `ray start --head` made) or starts a local one, and
prints one JSON line first: pid, logdir, ray address, dashboard URL, the metrics export port.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import ray
from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer
from ray.tune.registry import register_env
from ray.tune.utils.util import SafeFallbackEncoder

ENV_NAME = "replaywatch_cartpole"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algo", choices=("dqn", "appo"), default="dqn")
    p.add_argument("--address", default=None,
                   help="a running cluster's address (ray start --head); else a local one")
    p.add_argument("--num-cpus", type=int, default=4, help="a local cluster's logical CPUs")
    p.add_argument("--temp-dir", default=None,
                   help="a local cluster's temp dir (Ray's default: /tmp/ray)")
    p.add_argument("--num-env-runners", type=int, default=1)
    p.add_argument("--num-learners", type=int, default=0,
                   help="0: the Learner lives in the driver; 1: a Learner actor")
    p.add_argument("--num-aggregators", type=int, default=0,
                   help="APPO: aggregator actors per learner")
    p.add_argument("--rollout-fragment-length", default="auto")
    p.add_argument("--train-batch-size", type=int, default=64, help="per learner")
    p.add_argument("--training-intensity", type=float, default=None, help="DQN")
    p.add_argument("--learning-starts", type=int, default=500,
                   help="DQN: num_steps_sampled_before_learning_starts")
    p.add_argument("--replay-capacity", type=int, default=50_000, help="DQN")
    p.add_argument("--count-samples", action="store_true",
                   help="DQN: a uniform buffer that counts its evicted env steps never drawn "
                        "(each iteration's line says them): a bench's ground truth")
    p.add_argument("--uniform-replay", action="store_true",
                   help="DQN: EpisodeReplayBuffer instead of the prioritized default")
    p.add_argument("--learner-queue-size", type=int, default=None, help="APPO")
    p.add_argument("--circular-buffer-batches", type=int, default=None,
                   help="APPO's circular_buffer_num_batches (RLlib's 8): with 1, a learner "
                        "slower than its EnvRunners drops from its first slow update, not "
                        "once 8 batches have filled")
    p.add_argument("--sampler-wait-s", type=float, default=None,
                   help="APPO's timeout_s_sampler_manager: how long its driver waits for its "
                        "EnvRunners' samples each training step (RLlib's 0: it spins)")
    p.add_argument("--sample-timeout-s", type=float, default=None)
    p.add_argument("--min-steps-per-iteration", type=int, default=None,
                   help="min_sample_timesteps_per_iteration (DQN's default 1000)")
    p.add_argument("--min-time-per-iteration", type=float, default=None,
                   help="min_time_s_per_iteration")
    p.add_argument("--iterations", type=int, default=0, help="0: until --seconds")
    p.add_argument("--seconds", type=float, default=60.0, help="0: until --iterations")
    p.add_argument("--seconds-trained", type=float, default=0.0,
                   help="end this long after the first iteration whose row counts a trained "
                        "step (--seconds stays the cap): a healthy run whose length is its "
                        "training, however long a loaded host keeps it in start-up; 0: off")
    p.add_argument("--stop-on", default=None, metavar="FILE",
                   help="end (algo.stop()) after the iteration in which FILE exists: a job "
                        "its watcher ends once it showed what it is for")
    p.add_argument("--hang-env-after", type=int, default=0, help="env steps; 0: never")
    p.add_argument("--hang-env-runner", type=int, default=1,
                   help="the EnvRunner index whose env hangs (0: every one)")
    p.add_argument("--env-step-s", type=float, default=0.0,
                   help="seconds each env step takes (a simulator's pace; 0: CartPole's own)")
    p.add_argument("--hang-learner-after", type=int, default=0,
                   help="compute_losses calls; 0: never")
    p.add_argument("--hang-learner-after-s", type=float, default=0.0,
                   help="seconds from the learner's first update; 0: never (a hang that "
                        "comes after a phase long enough to judge, whatever the host's pace)")
    p.add_argument("--hang-learner-on", default=None, metavar="FILE",
                   help="the Learner hangs in its next update once FILE exists (a hang its "
                        "watcher switches on once it has judged what came before, whatever "
                        "the host's pace; the Learner must see this host's files)")
    p.add_argument("--learner-step-s", type=float, default=0.0,
                   help="seconds added to every compute_losses: a learner slower than its "
                        "EnvRunners (a big network on a small host)")
    p.add_argument("--learner-slow-after-s", type=float, default=0.0,
                   help="seconds from the learner's first update before --learner-step-s "
                        "applies: a healthy phase, then a slow learner")
    p.add_argument("--logdir", default=None, help="default: the algorithm's own logdir")
    p.add_argument("--probe-listen", default=None, metavar="HOST:PORT",
                   help="attach replaywatch's RLlibProbe (its callbacks) serving there")
    p.add_argument("--obs-kib", type=int, default=0,
                   help="pad each observation with this many KiB of noise (0: CartPole's own)")
    p.add_argument("--cgroup", default=None, metavar="DIR",
                   help="join this cgroup (v1 memory, as root) before the cluster starts")
    p.add_argument("--no-rows", action="store_true",
                   help="write no result.json (a plain loop's default: Ray writes none)")
    args = p.parse_args(argv)
    if not args.iterations and not args.seconds:
        p.error("give --iterations or --seconds")
    return args


class HangAfterSteps(gym.Wrapper):
    """An environment whose `step()` takes `step_s` and never returns after `after` steps: a
    hung simulator."""

    def __init__(self, env: gym.Env, after: int, step_s: float = 0.0) -> None:
        super().__init__(env)
        self._after = after
        self._step_s = step_s
        self._steps = 0

    def step(self, action):  # type: ignore[no-untyped-def]
        self._steps += 1
        if self._after and self._steps > self._after:
            while True:
                time.sleep(3600)
        if self._step_s:
            time.sleep(self._step_s)
        return self.env.step(action)


class PaddedObs(gym.ObservationWrapper):
    """CartPole's 4 floats followed by `kib` KiB of noise: an observation the size of a
    frame, so that the replay buffer's memory grows as an image agent's does."""

    def __init__(self, env: gym.Env, kib: int) -> None:
        super().__init__(env)
        self._pad = kib * 256
        self._rng = np.random.default_rng(0)
        low = np.concatenate([env.observation_space.low, np.zeros(self._pad, np.float32)])
        high = np.concatenate([env.observation_space.high, np.ones(self._pad, np.float32)])
        self.observation_space = gym.spaces.Box(low, high, dtype=np.float32)

    def observation(self, observation: Any) -> Any:
        return np.concatenate([observation.astype(np.float32),
                               self._rng.random(self._pad, dtype=np.float32)])


def env_creator(env_config: Any) -> gym.Env:
    env = gym.make("CartPole-v1")
    if env_config.get("obs_kib", 0):
        env = PaddedObs(env, env_config["obs_kib"])
    runner = getattr(env_config, "worker_index", 0)
    chosen = env_config.get("hang_env_runner", 1)
    after = env_config.get("hang_env_after", 0)
    return HangAfterSteps(env, after if chosen in (0, runner) else 0,
                          env_config.get("env_step_s", 0.0))


def hanging_learner(base: type, after: int, step_s: float = 0.0,
                    slow_after_s: float = 0.0, after_s: float = 0.0,
                    on_file: str | None = None) -> type:
    """`base` whose `compute_losses` never returns after `after` calls, once `after_s`
    have passed since its first (0: always returns) or once `on_file` exists, a hung
    learner, and takes `step_s` longer each call once `slow_after_s` have passed since its
    first, a slow one."""

    class HangingLearner(base):  # type: ignore[misc, valid-type]
        _calls = 0
        _first: float | None = None

        def compute_losses(self, *args: Any, **kwargs: Any) -> Any:
            self._calls += 1
            if self._first is None:
                self._first = time.monotonic()
            if (after and self._calls > after) or (
                    after_s and time.monotonic() - self._first >= after_s) or (
                    on_file and os.path.exists(on_file)):
                while True:
                    time.sleep(3600)
            if step_s and time.monotonic() - self._first >= slow_after_s:
                time.sleep(step_s)
            return super().compute_losses(*args, **kwargs)

    HangingLearner.__name__ = HangingLearner.__qualname__ = (
        ("Hanging" if after or after_s or on_file else "Slow") + base.__name__)
    return HangingLearner


class _Drawn:
    """The buffer's generator, recording each index drawn over all the buffer's env steps:
    a sample's start (uniform sampling draws `integers(len(_indices))` once per item)."""

    def __init__(self, rng: Any, buffer: Any) -> None:
        self._rng, self._buffer = rng, buffer

    def integers(self, *args: Any, **kwargs: Any) -> Any:
        out = self._rng.integers(*args, **kwargs)
        indices = self._buffer._indices
        if len(args) == 1 and not kwargs and args[0] == len(indices):
            self._buffer.drawn.add(indices[int(out)])
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rng, name)


class CountedEpisodeReplayBuffer(EpisodeReplayBuffer):  # type: ignore[misc]
    """A uniform EpisodeReplayBuffer that counts, as the bench's ground truth, the env steps
    it evicted and how many of them were never drawn as a sample: what the sidecar can only
    estimate from the buffer's counters. Named by its path ("__main__...": RLlib builds the
    driver's buffer from a string whose name says EpisodeReplayBuffer)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rng = _Drawn(self.rng, self)
        self.drawn: set[tuple[int, int]] = set()
        self.lengths: dict[int, int] = {}
        self.counted_evictions = 0
        self.evicted_steps = self.evicted_never_drawn = 0

    def add(self, episodes: Any) -> None:
        before = self._num_episodes_evicted
        # Lengths of what is stored now: an episode evicted by this add is one of these (or
        # arrives and leaves in the same call, never drawn)
        for i, eps in enumerate(self.episodes):
            self.lengths[before + i] = len(eps)
        super().add(episodes)
        for i, eps in enumerate(self.episodes):
            self.lengths[self._num_episodes_evicted + i] = len(eps)
        for idx in range(self.counted_evictions, self._num_episodes_evicted):
            n = self.lengths.pop(idx, 0)
            self.evicted_steps += n
            self.evicted_never_drawn += sum(1 for ts in range(n) if (idx, ts) not in self.drawn)
            self.drawn -= {(idx, ts) for ts in range(n)}
        self.counted_evictions = self._num_episodes_evicted


def build_config(args: argparse.Namespace) -> Any:
    if args.algo == "dqn":
        from ray.rllib.algorithms.dqn import DQNConfig

        config = DQNConfig()
        training: dict[str, Any] = dict(
            num_steps_sampled_before_learning_starts=args.learning_starts,
            replay_buffer_config={
                "type": "__main__.CountedEpisodeReplayBuffer" if args.count_samples
                else "EpisodeReplayBuffer"
                if args.uniform_replay else "PrioritizedEpisodeReplayBuffer",
                "capacity": args.replay_capacity,
                **({} if args.uniform_replay or args.count_samples
                   else {"alpha": 0.6, "beta": 0.4}),
            },
        )
        if args.training_intensity is not None:
            training["training_intensity"] = args.training_intensity
    else:
        from ray.rllib.algorithms.appo import APPOConfig

        config = APPOConfig()
        training = {}
        if args.learner_queue_size is not None:
            training["learner_queue_size"] = args.learner_queue_size
        if args.circular_buffer_batches is not None:
            training["circular_buffer_num_batches"] = args.circular_buffer_batches
        if args.sampler_wait_s is not None:
            training["timeout_s_sampler_manager"] = args.sampler_wait_s
    fragment = args.rollout_fragment_length
    runners: dict[str, Any] = dict(
        num_env_runners=args.num_env_runners,
        rollout_fragment_length=fragment if fragment == "auto" else int(fragment),
    )
    if args.sample_timeout_s is not None:
        runners["sample_timeout_s"] = args.sample_timeout_s
    config = (
        config.environment(ENV_NAME, env_config={"hang_env_after": args.hang_env_after,
                                                 "hang_env_runner": args.hang_env_runner,
                                                 "env_step_s": args.env_step_s,
                                                 "obs_kib": args.obs_kib})
        .framework("torch")
        .env_runners(**runners)
        .learners(num_learners=args.num_learners, **(
            {"num_aggregator_actors_per_learner": args.num_aggregators}
            if args.algo == "appo" else {}))
        .training(train_batch_size_per_learner=args.train_batch_size, **training)
    )
    reporting: dict[str, Any] = {}
    if args.min_steps_per_iteration is not None:
        reporting["min_sample_timesteps_per_iteration"] = args.min_steps_per_iteration
    if args.min_time_per_iteration is not None:
        reporting["min_time_s_per_iteration"] = args.min_time_per_iteration
    config.reporting(**reporting)
    if (args.hang_learner_after or args.hang_learner_after_s or args.hang_learner_on
            or args.learner_step_s):
        config.training(learner_class=hanging_learner(config.get_default_learner_class(),
                                                      args.hang_learner_after,
                                                      args.learner_step_s,
                                                      args.learner_slow_after_s,
                                                      args.hang_learner_after_s,
                                                      args.hang_learner_on))
    return config


def write_row(path: Path, result: dict[str, Any]) -> None:
    with path.open("a") as f:  # Tune's JsonLoggerCallback: one object a line, flushed
        json.dump(result, f, cls=SafeFallbackEncoder)
        f.write("\n")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.cgroup:  # before ray.init: the local cluster's processes join it with the driver
        with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
    if args.address:
        context = ray.init(address=args.address)
    else:
        context = ray.init(num_cpus=args.num_cpus, include_dashboard=True,
                           _temp_dir=args.temp_dir)
    register_env(ENV_NAME, env_creator)
    config = build_config(args)
    probe = None
    if args.probe_listen:
        # Only the probe, standard library only, as a user's job would import it.
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from replaywatch.probe.rllib import RLlibProbe

        probe = RLlibProbe(listen=args.probe_listen)
        config.callbacks(**probe.callbacks())
    algo = config.build_algo()
    logdir = Path(args.logdir or algo.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    with (logdir / "params.json").open("w") as f:
        json.dump(config.to_dict(), f, indent=2, sort_keys=True, cls=SafeFallbackEncoder)
    node = ray._private.worker.global_worker.node
    print(json.dumps({
        "event": "rllib_job", "pid": os.getpid(), "algo": args.algo,
        "job_id": ray.get_runtime_context().get_job_id(),
        "logdir": str(logdir), "result_json": str(logdir / "result.json"),
        "ray_address": context.address_info["gcs_address"],
        "dashboard_url": "http://" + context.dashboard_url if context.dashboard_url else None,
        "metrics_export_port": node.metrics_export_port, "session_dir": node.get_session_dir_path(),
        "rllib_probe": probe.url if probe is not None else None,
    }), flush=True)
    start = time.monotonic()
    iteration = 0
    first_trained: float | None = None
    while True:
        result = algo.train()
        iteration += 1
        if first_trained is None and trained_steps(result) > 0:
            first_trained = time.monotonic()
        if not args.no_rows:
            write_row(logdir / "result.json", result)
        line = {"event": "iteration", "iteration": iteration,
                "time_this_iter_s": round(result.get("time_this_iter_s", 0.0), 3)}
        buffer = getattr(algo, "local_replay_buffer", None)
        if args.count_samples and buffer is not None:
            line.update(evicted_steps=buffer.evicted_steps,
                        evicted_never_drawn=buffer.evicted_never_drawn,
                        added=buffer.get_added_timesteps(),
                        sampled=buffer.get_sampled_timesteps())
        print(json.dumps(line), flush=True)
        if args.iterations and iteration >= args.iterations:
            break
        if args.seconds and time.monotonic() - start >= args.seconds:
            break
        if args.seconds_trained and first_trained is not None and (
                time.monotonic() - first_trained >= args.seconds_trained):
            break
        if args.stop_on and os.path.exists(args.stop_on):
            break
    algo.stop()
    ray.shutdown()
    return 0


def trained_steps(result: dict[str, Any]) -> float:
    """The env steps the learners trained on so far, as the row says (0 where it does not).

    The key replaywatch's row reader takes (ResultKeys.ENV_STEPS_TRAINED_LIFETIME), read
    here by hand: the job imports nothing of replaywatch unless `--probe-listen` asks, as a
    user's job would not."""
    counted = result.get("learners", {}).get("__all_modules__", {})
    return float(counted.get("num_env_steps_trained_lifetime", 0) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
