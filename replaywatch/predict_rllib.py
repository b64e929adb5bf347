"""`replaywatch predict --rllib`: the replay ratio and the warm-up of an RLlib DQN-family job
from its configuration, before it starts (the arithmetic: diagnosis/rllib_ratio.py).

    replaywatch predict --rllib --train-batch-size 32 --num-env-runners 1 \
        --training-intensity 4

Exit 0 when the job trains at the ratio it asks for (or asks for none), 1 when RLlib's
rounding and its count of samplers give another, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
from typing import IO, Any

from replaywatch.diagnosis.rllib_ratio import (
    TOLERANCE,
    RatioVerdict,
    RllibReplay,
    intensity_for,
    ratio,
    warm_up_beyond_capacity,
)
from replaywatch.errors import ConfigError

# The flags' destinations, in RllibReplay's names.
FLAGS = ("train_batch_size", "num_env_runners", "num_envs_per_env_runner",
         "rollout_fragment_length", "n_step", "training_intensity", "capacity",
         "learning_starts")


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("RLlib (DQN family: DQN, SAC; with --rllib)")
    g.add_argument("--rllib", action="store_true",
                   help="judge an RLlib configuration's replay ratio and warm-up instead")
    g.add_argument("--train-batch-size", type=int, metavar="B",
                   help="train_batch_size_per_learner x num_learners (or 1)")
    g.add_argument("--num-env-runners", type=int, metavar="N", default=None)
    g.add_argument("--num-envs-per-env-runner", type=int, metavar="E", default=None)
    g.add_argument("--rollout-fragment-length", metavar="F|auto", default=None,
                   help="auto (DQN: its n_step) or a number")
    g.add_argument("--n-step", type=int, metavar="N", default=None)
    g.add_argument("--training-intensity", type=float, metavar="R", default=None)
    g.add_argument("--capacity", type=int, metavar="STEPS", default=None,
                   help="replay_buffer_config's capacity")
    g.add_argument("--learning-starts", type=int, metavar="STEPS", default=None,
                   help="num_steps_sampled_before_learning_starts")


def config_from(args: argparse.Namespace) -> RllibReplay:
    if args.train_batch_size is None:
        raise ConfigError("--rllib needs --train-batch-size")
    fragment = args.rollout_fragment_length
    if fragment is not None and fragment != "auto":
        try:
            fragment = int(fragment)
        except ValueError:
            raise ConfigError(f"--rollout-fragment-length {fragment!r} is not a number or "
                              "auto") from None
    given = {name: getattr(args, name) for name in FLAGS if getattr(args, name) is not None}
    given["rollout_fragment_length"] = None if fragment == "auto" else fragment
    try:
        return RllibReplay(**{k: v for k, v in given.items() if v is not None})
    except ValueError as e:
        raise ConfigError(str(e)) from None


def document(r: RllibReplay) -> dict[str, Any]:
    got = ratio(r)
    fix = None
    if got.verdict is RatioVerdict.OFF and got.asked is not None:
        fix = intensity_for(r, got.asked)
    return {
        "verdict": got.verdict, "trained_per_sampled": got.trained_per_sampled,
        "training_intensity": got.asked, "off_by": got.off_by,
        "weights": {"store": got.store_rounds, "train": got.train_rounds},
        "natural_ratio_rllib": r.natural,
        "sampled_per_store_round": r.sampled_per_round,
        "fix": None if fix is None else {"knob": "training_intensity", "value": fix,
                                         "trains_at": ratio(_with(r, fix)).trained_per_sampled},
        "no_fix_why": (None if fix is not None or got.verdict is RatioVerdict.AS_ASKED else
                       f"no whole number of store or train rounds trains within "
                       f"{TOLERANCE:.0%} of {got.asked:g}: change train_batch_size or "
                       "rollout_fragment_length"),
        "warm_up_beyond_capacity": warm_up_beyond_capacity(r),
        "learning_starts": r.learning_starts, "capacity": r.capacity,
    }


def _with(r: RllibReplay, intensity: float) -> RllibReplay:
    from dataclasses import replace
    return replace(r, training_intensity=intensity)


def render_text(doc: dict[str, Any], out: IO[str]) -> None:
    w = doc["weights"]
    asked = doc["training_intensity"]
    verdict = ("natural (no training_intensity)" if asked is None else "as asked"
               if doc["verdict"] == RatioVerdict.AS_ASKED else "OFF")
    print(f"replay ratio: {verdict}: trains {doc['trained_per_sampled']:g} env steps per env "
          f"step sampled" + ("" if asked is None else f" (training_intensity {asked:g})"),
          file=out)
    counted = ("" if asked is None else f"; RLlib sets them from a natural ratio of "
               f"{doc['natural_ratio_rllib']:g}, counting one EnvRunner more than samples")
    print(f"  RLlib alternates {w['store']} sampling round(s) of "
          f"{doc['sampled_per_store_round']} env steps with {w['train']} training round(s) of "
          f"train_batch_size{counted}", file=out)
    if doc["fix"]:
        f = doc["fix"]
        print(f"fix: training_intensity={f['value']:g} trains at {f['trains_at']:g}", file=out)
    elif doc["no_fix_why"]:
        print(f"fix: {doc['no_fix_why']}", file=out)
    if doc["warm_up_beyond_capacity"]:
        print(f"warm-up: learning starts after {doc['learning_starts']} sampled steps, more "
              f"than the buffer holds ({doc['capacity']}): it starts, on the last "
              f"{doc['capacity']} only", file=out)


def run(args: argparse.Namespace, out: IO[str]) -> int:
    doc = document(config_from(args))
    if args.json:
        json.dump(doc, out)
        print(file=out)
    else:
        render_text(doc, out)
    return 0 if doc["verdict"] == RatioVerdict.AS_ASKED else 1
