"""A plain RLlib job, watched by replaywatch with no code change: DQN on CartPole-v1.

Nothing of replaywatch is in it. It is RLlib's new API stack (Ray 2.60, torch) in a plain
`algo.train()` loop, plus the one thing a plain loop lacks: its result rows. Ray 2.60 writes
result.json only under Tune, so this loop appends each iteration's row to
`<results-dir>/<start time>/result.json` (and the config to `params.json` beside it) as Tune's
JsonLoggerCallback would. From the rows the sidecar reads the replay buffer's counters and the
`training_intensity` the ratio is judged against; without them it still reads the actors,
their running calls and RLlib's metrics.

Start the job (it starts a local cluster, Ray's dashboard on 127.0.0.1:8265 and its temp dir
/tmp/ray; `--address` joins a `ray start --head` instead). Ray and torch are in `.venv-rllib`
here (`make rllib-venv`):

    python examples/rllib_dqn.py --results-dir /tmp/rllib_dqn

and, beside it on the same host, the sidecar (the newest run's rows are found under the
directory; the page, `/api/v1/ray` and `/metrics` on 127.0.0.1:9321):

    replaywatch watch --ray 127.0.0.1:8265 --ray-temp-dir /tmp/ray --ray-results /tmp/rllib_dqn

What it reads and names: docs/rllib.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.dqn import DQNConfig
from ray.tune.utils.util import SafeFallbackEncoder


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None,
                   help="a running cluster's address (ray start --head); else a local one")
    p.add_argument("--results-dir", default="/tmp/rllib_dqn",
                   help="each run's rows go to a directory of its own under this one")
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--num-env-runners", type=int, default=2,
                   help="EnvRunner actors (DQN's default, 0, samples in the driver)")
    return p.parse_args(argv)


def build_config(num_env_runners: int) -> DQNConfig:
    return (
        DQNConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .env_runners(num_env_runners=num_env_runners)
        .training(
            train_batch_size_per_learner=32,
            num_steps_sampled_before_learning_starts=1000,
            replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                  "capacity": 50_000, "alpha": 0.6, "beta": 0.4},
        )
    )


def write_row(path: Path, result: dict[str, Any]) -> None:
    # As Tune's JsonLoggerCallback: one object a line, flushed, so a reader tails whole rows.
    with path.open("a") as f:
        json.dump(result, f, cls=SafeFallbackEncoder)
        f.write("\n")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(include_dashboard=True)
    config = build_config(args.num_env_runners)
    algo = config.build_algo()
    # A directory per run, as Tune keeps a trial's: the reader takes the newest result.json.
    run = Path(args.results_dir) / time.strftime("DQN_%Y-%m-%d_%H-%M-%S")
    run.mkdir(parents=True, exist_ok=True)
    with (run / "params.json").open("w") as f:
        json.dump(config.to_dict(), f, indent=2, sort_keys=True, cls=SafeFallbackEncoder)
    for _ in range(args.iterations):
        result = algo.train()
        write_row(run / "result.json", result)
        mean = result.get("env_runners", {}).get("episode_return_mean", float("nan"))
        print(f"iteration {result['training_iteration']}: return {mean:.1f}", flush=True)
    algo.stop()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
