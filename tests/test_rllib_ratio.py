"""The replay ratio of an RLlib DQN-family job from its configuration (diagnosis/rllib_ratio.py),
on the two configurations measured in docs/research/rllib-observables.md and the rounding."""

from __future__ import annotations

import pytest

from replaywatch.diagnosis.rllib_ratio import (
    RatioVerdict,
    RllibReplay,
    intensity_for,
    ratio,
    warm_up_beyond_capacity,
    weights,
)


def test_no_intensity_trains_at_the_batch_over_what_a_round_samples() -> None:
    # DQN's defaults measured: 2 EnvRunners, fragment auto (n_step 1), batch 32: 16000
    # trained for 1000 sampled.
    r = ratio(RllibReplay(train_batch_size=32, num_env_runners=2))
    assert (r.store_rounds, r.train_rounds, r.trained_per_sampled) == (1, 1, 16.0)
    assert r.verdict is RatioVerdict.AS_ASKED and r.off_by is None


def test_an_intensity_of_4_with_one_env_runner_trains_at_8() -> None:
    # Measured: 1600 trained for 200 sampled. RLlib's natural ratio counts a local sampler
    # that does not sample (32 / (1 x 1 x 2) = 16), so it samples 4 rounds of 1 step per
    # batch of 32.
    config = RllibReplay(train_batch_size=32, num_env_runners=1, training_intensity=4)
    assert config.natural == 16.0 and weights(config) == (4, 1)
    r = ratio(config)
    assert r.trained_per_sampled == 8.0 and r.off_by == 2.0
    assert r.verdict is RatioVerdict.OFF
    fixed = intensity_for(config, 4.0)
    assert fixed is not None
    again = ratio(RllibReplay(train_batch_size=32, num_env_runners=1,
                              training_intensity=fixed))
    # The setting that trains at 4 reads 2: RLlib's count has one sampler more.
    assert again.trained_per_sampled == 4.0 and fixed == 2.0


def test_with_the_learner_local_and_no_remote_runner_the_count_is_right() -> None:
    # num_env_runners 0: the local EnvRunner samples, and RLlib's count agrees.
    config = RllibReplay(train_batch_size=32, training_intensity=4)
    assert weights(config) == (8, 1)
    assert ratio(config).trained_per_sampled == 4.0


def test_whole_rounds_cannot_give_every_ratio() -> None:
    # Batch 32 over 10 steps a round: 3.2, 6.4, ... or 32 / n: 5.0 is none of them.
    config = RllibReplay(train_batch_size=32, num_env_runners=1, rollout_fragment_length=10)
    assert intensity_for(config, 5.0) is None
    assert intensity_for(config, 3.2) is not None


def test_a_warm_up_above_capacity_is_said_but_ends() -> None:
    assert warm_up_beyond_capacity(RllibReplay(32, capacity=1000, learning_starts=5000))
    assert not warm_up_beyond_capacity(RllibReplay(32, capacity=50000, learning_starts=5000))
    assert not warm_up_beyond_capacity(RllibReplay(32))


@pytest.mark.parametrize("bad", [dict(train_batch_size=0), dict(num_env_runners=-1),
                                 dict(training_intensity=0.0),
                                 dict(rollout_fragment_length=0)])
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RllibReplay(**{"train_batch_size": 32, **bad})  # type: ignore[arg-type]
