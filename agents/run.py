"""`python -m agents.run`: the one CLI, and the only place flags are read.

It prints one JSON line first, flushed at once, so `replaywatch watch` can attach:

    {"event": "start", "mode": "sync", "reverb": "127.0.0.1:PORT",
     "probe": "http://127.0.0.1:PORT", "table": "priority_table", ...}

then JSON lines as it goes: `progress` (env steps/s, learner steps/s, table
counters), `eval` (mean evaluation return), `done`. Examples:

    python -m agents.run --mode sync --steps 30000                      # learns Pendulum
    python -m agents.run --mode sync --num-parallel-calls 12 --batch-size 256 \\
        --samples-per-insert 128 --min-replay-size 4000 --tolerance 0.002  # the seed's hang
    python -m agents.run --mode distributed --num-actors 4 --inject-stall actors-exit@30
    python -m agents.run --mode distributed --ray-address 127.0.0.1:6379 \\
        --replay-resource replay --learner-resource learner --actor-resource actor
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from agents.config import ReplayConfig, RunConfig, StallInjection, StepDelay, TD3Config


def _emit(record: dict[str, Any]) -> None:
    # stdout is read by tests and by whoever attaches the sidecar: one flushed line each.
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # One line, exit 2: the usage block would bury the value that was wrong.
        self.exit(2, f"{self.prog}: error: {message}\n")


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m agents.run", description="TD3 on Reverb, sync or distributed on Ray."
    )
    defaults_run, defaults_replay = RunConfig(), ReplayConfig()
    add = parser.add_argument
    add("--mode", choices=("sync", "distributed"), default="sync")
    add("--steps", type=int, default=defaults_run.steps, help="environment steps, all actors")
    add("--num-actors", type=int, default=defaults_run.num_actors, help="distributed only")
    add("--batch-size", type=int, default=defaults_replay.batch_size)
    add("--samples-per-insert", type=float, default=defaults_replay.samples_per_insert)
    add("--min-replay-size", type=int, default=defaults_replay.min_replay_size)
    add("--max-replay-size", type=int, default=defaults_replay.max_replay_size)
    add(
        "--tolerance",
        type=float,
        default=defaults_replay.tolerance,
        help="error_buffer = min_replay_size * samples_per_insert * tolerance",
    )
    add(
        "--num-parallel-calls",
        type=int,
        default=defaults_replay.num_parallel_calls,
        help="dataset workers, each batching on its own (Acme's default: 12)",
    )
    add("--prefetch-size", type=int, default=defaults_replay.prefetch_size)
    add("--table", default=defaults_replay.table)
    add("--reverb-port", type=int, default=defaults_run.reverb_port, help="0: any free port")
    add("--probe-listen", default=defaults_run.probe_listen, metavar="HOST:PORT")
    add("--replay-probe-listen", default=None, metavar="HOST:PORT",
        help="serve a ReplayProbe (the Reverb server's memory and limit) from its process")
    add("--seed", type=int, default=defaults_run.seed)
    add("--pixels", action="store_true", help="rendered 64x64 frames, conv encoder (DrQ-v2)")
    add("--image-size", type=int, default=TD3Config().image_size)
    add(
        "--eval-every",
        type=int,
        default=defaults_run.eval_every,
        help="environment steps between evaluations; 0: none",
    )
    add("--eval-episodes", type=int, default=defaults_run.eval_episodes)
    add("--log-every", type=float, default=defaults_run.log_every_s, metavar="SECONDS")
    add("--n-step", type=int, default=TD3Config().n_step)
    add("--actor-update-period", type=int, default=defaults_run.actor_update_period)
    add(
        "--replace-dead-actors-after",
        type=float,
        default=defaults_run.replace_dead_actors_after_s,
        metavar="SECONDS",
        help="distributed: start a replacement this long after an actor dies; < 0: never",
    )
    add("--ray-address", default=None, help="an existing Ray cluster; default: start one here")
    for role, where in (("replay", "the Reverb server"), ("learner", "the learner"),
                        ("actor", "every actor")):
        add(f"--{role}-resource", default=None, metavar="NAME",
            help=f"distributed: place {where} on a node offering this Ray custom resource")
    add(
        "--max-policy-lag",
        type=int,
        default=defaults_run.max_policy_lag,
        metavar="STEPS",
        help="distributed: an actor that took STEPS environment steps without seeing the learner "
        "step waits for it, then fetches its parameters (a policy-lag bound); 0: never wait",
    )
    add(
        "--first-step-delay-s",
        type=float,
        default=defaults_run.first_step_delay_s,
        metavar="SECONDS",
        help="both modes: sleep this long inside the learner's first update, after its first "
        "batch is taken; a stand-in for a long first JAX compile (acme#212), not a real one",
    )
    add("--learner-step-delay-s", type=float, default=defaults_run.learner_step_delay_s,
        metavar="SECONDS", help="both modes: every learner update sleeps this long after its "
        "batch (a slow step: a big network on a small host)")
    add("--env-step-delay-s", type=float, default=0.0, metavar="SECONDS",
        help="every environment step sleeps this long (a costly simulator)")
    add("--slow-down", default=None, metavar="FACTOR[x]@SECONDS[:RAMP]",
        help="the step delay grows FACTOR times from SECONDS after each environment starts, "
        "over RAMP seconds (e.g. 10@240:90); FACTORx@SECONDS (e.g. 2x@240): each actor "
        "loop FACTOR times slower than its minute before: throughput that falls without "
        "blocking")
    add("--checkpoint-every-s", type=float, default=0.0, metavar="SECONDS",
        help="checkpoint the Reverb server every SECONDS (client.checkpoint()); 0: never")
    add("--sampler", choices=("uniform", "prioritized"), default=defaults_replay.sampler,
        help="prioritized: the learner sends each batch's |TD error| back as priorities")
    add("--priority-exponent", type=float, default=defaults_replay.priority_exponent)
    add("--queue", action="store_true",
        help="distributed: the table is reverb.Table.queue (each item sampled once, in order)")
    add("--no-actor-probes", action="store_true",
        help="no ActorProbe on the actors (distributed) or on the loop (sync)")
    add(
        "--seed-debug-loop",
        action="store_true",
        help="sync: read table.info and print the limiter's numbers before every learner "
        "step, as the seed incident's user did (to measure its cost)",
    )
    add(
        "--inject-stall",
        default=None,
        metavar="KIND@SECONDS",
        help="actor-exit@S, actors-exit@S (distributed) or learner-hang@S",
    )
    return parser


def configs_from_args(
    argv: Sequence[str] | None = None,
) -> tuple[TD3Config, ReplayConfig, RunConfig]:
    """Parses flags into the three configs; bad values exit 2 with a one-line error."""
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        td3 = TD3Config(pixels=args.pixels, image_size=args.image_size, n_step=args.n_step)
        replay = ReplayConfig(
            table=args.table,
            batch_size=args.batch_size,
            samples_per_insert=args.samples_per_insert,
            tolerance=args.tolerance,
            min_replay_size=args.min_replay_size,
            max_replay_size=args.max_replay_size,
            num_parallel_calls=args.num_parallel_calls,
            prefetch_size=args.prefetch_size,
            queue=args.queue,
            sampler=args.sampler,
            priority_exponent=args.priority_exponent,
        )
        stall = StallInjection.parse(args.inject_stall) if args.inject_stall else None
        run = RunConfig(
            mode=args.mode,
            steps=args.steps,
            num_actors=args.num_actors,
            seed=args.seed,
            eval_every=args.eval_every,
            eval_episodes=args.eval_episodes,
            log_every_s=args.log_every,
            reverb_port=args.reverb_port,
            probe_listen=args.probe_listen,
            replay_probe_listen=args.replay_probe_listen,
            actor_update_period=args.actor_update_period,
            replace_dead_actors_after_s=args.replace_dead_actors_after,
            ray_address=args.ray_address,
            stall=stall,
            seed_debug_loop=args.seed_debug_loop,
            actor_probes=not args.no_actor_probes,
            max_policy_lag=args.max_policy_lag,
            first_step_delay_s=args.first_step_delay_s,
            learner_step_delay_s=args.learner_step_delay_s,
            env_step_delay=StepDelay.parse(args.env_step_delay_s, args.slow_down),
            checkpoint_every_s=args.checkpoint_every_s,
            replay_resource=args.replay_resource,
            learner_resource=args.learner_resource,
            actor_resource=args.actor_resource,
        )
        if replay.queue and run.mode != "distributed":
            raise ValueError("--queue needs --mode distributed: a queue's inserts block when "
                             "it is full, and in sync mode the learner is the inserting thread")
    except ValueError as error:
        parser.error(str(error))
    _check_listen(parser, run.probe_listen)
    if run.replay_probe_listen is not None:
        _check_listen(parser, run.replay_probe_listen)
    return td3, replay, run


def _check_listen(parser: argparse.ArgumentParser, listen: str) -> None:
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        parser.error(f"--probe-listen ({listen!r}) must be HOST:PORT, e.g. 127.0.0.1:0")


def main(argv: Sequence[str] | None = None) -> int:
    td3, replay, run = configs_from_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TF's info lines are noise here
    if run.mode == "sync":
        from agents.local import run_sync

        run_sync(td3, replay, run, _emit)
    else:
        from agents.placement import prepare_ray_environment

        prepare_ray_environment(run.ray_address)  # before Ray is imported
        from agents.distributed import run_distributed

        run_distributed(td3, replay, run, _emit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
