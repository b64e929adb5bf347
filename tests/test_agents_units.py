"""The agent's parts, in process: configs, adder, replay, learner update, sync loop.

Reverb is real (an in-process server); the sync loop's table and iterator are
small fakes behind the two methods it calls (`ready()`, `can_sample()`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import reverb

from agents import replay as replay_lib
from agents.acting import PolicyLagBound
from agents.adders import NStepTransitionAdder, transition_example
from agents.config import (
    ReplayConfig,
    RunConfig,
    StallInjection,
    StallKind,
    StepDelay,
    TD3Config,
)
from agents.environments import (
    Pacer,
    make_environment,
    make_environment_spec,
    render_pendulum,
)
from agents.learning import Transition, make_initial_state, make_update_fn
from agents.local import LearningActor
from agents.networks import make_networks, random_crop
from agents.run import configs_from_args
from agents.stalls import StallTimer
from harness.procs import wait_until
from replaywatch.probe import ActorProbe


# -- configuration ------------------------------------------------------------
@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: ReplayConfig(batch_size=0), "batch_size (0) must be >= 1"),
        (lambda: ReplayConfig(num_parallel_calls=0), "num_parallel_calls (0) must be >= 1"),
        (lambda: ReplayConfig(tolerance=1e-6), "error_buffer"),
        (lambda: TD3Config(n_step=0), "n_step (0) must be >= 1"),
        (lambda: RunConfig(steps=0), "steps (0) must be >= 1"),
        (
            lambda: RunConfig(stall=StallInjection(StallKind.ACTOR_EXIT, 1)),
            "needs --mode distributed",
        ),
    ],
)
def test_config_rejects_bad_values_naming_the_value(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make()


def test_error_buffer_is_min_size_times_spi_times_tolerance() -> None:
    config = ReplayConfig(min_replay_size=2000, samples_per_insert=128, tolerance=0.1)
    assert config.error_buffer == pytest.approx(25_600)
    assert config.max_in_flight_samples_per_worker == 2 * config.batch_size


@pytest.mark.parametrize(
    "text, kind, after_s",
    [
        ("actor-exit@30", StallKind.ACTOR_EXIT, 30.0),
        ("actors-exit@2.5", StallKind.ACTORS_EXIT, 2.5),
        ("learner-hang@0", StallKind.LEARNER_HANG, 0.0),
    ],
)
def test_stall_flag_parses_kind_and_seconds(text: str, kind: StallKind, after_s: float) -> None:
    assert StallInjection.parse(text) == StallInjection(kind, after_s)


@pytest.mark.parametrize("text", ["actor-exit", "nap@3", "learner-hang@soon", "actor-exit@-1"])
def test_stall_flag_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError):
        StallInjection.parse(text)


def test_bad_flag_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        configs_from_args(["--num-parallel-calls", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "num_parallel_calls (0)" in err


def test_stall_timer_fires_only_for_its_kind_after_its_time() -> None:
    now = [100.0]
    timer = StallTimer(StallInjection(StallKind.ACTOR_EXIT, 5), 100.0, clock=lambda: now[0])
    assert not timer.due(StallKind.ACTOR_EXIT)
    now[0] = 105.0
    assert timer.due(StallKind.ACTOR_EXIT)
    assert not timer.due(StallKind.LEARNER_HANG)


# -- environment and networks -------------------------------------------------
def test_pixel_pendulum_observes_stacked_uint8_frames() -> None:
    env = make_environment(0, pixels=True, image_size=32, frame_stack=3)
    observation, _ = env.reset(seed=0)
    assert observation.shape == (32, 32, 3) and observation.dtype == np.uint8
    observation, *_ = env.step(np.zeros(1, np.float32))
    assert observation.max() == 255


def test_rendered_rod_points_up_at_theta_zero() -> None:
    frame = render_pendulum(0.0, 32)
    top, bottom = frame[:12].sum(), frame[20:].sum()
    assert top > 0 and bottom == 0


def test_random_crop_keeps_shape_and_shifts_content() -> None:
    images = jnp.asarray(np.random.default_rng(0).integers(0, 255, (8, 16, 16, 3)), jnp.uint8)
    cropped = random_crop(jax.random.PRNGKey(0), images, padding=4)
    assert cropped.shape == images.shape
    assert not np.array_equal(np.asarray(cropped), np.asarray(images))


# -- adder and replay, through a real Reverb server ---------------------------
@pytest.fixture
def fifo_server() -> Iterator[tuple[reverb.Client, str]]:
    example = transition_example((3,), np.float32, 1)
    table = reverb.Table.queue("queue", 100, signature=replay_lib.make_signature(example))
    server = reverb.Server([table], port=None)
    yield reverb.Client(f"localhost:{server.port}"), "queue"
    server.stop()


def _episode(adder: NStepTransitionAdder, rewards: list[float], terminated: bool) -> None:
    adder.add_first(np.full(3, 0, np.float32))
    for t, reward in enumerate(rewards):
        last = t == len(rewards) - 1
        adder.add(
            np.array([t], np.float32),
            reward,
            np.full(3, t + 1, np.float32),
            terminated=terminated and last,
            truncated=not terminated and last,
        )


def _drain(client: reverb.Client, table: str, count: int) -> list[dict[str, Any]]:
    samples = client.sample(
        table, num_samples=count, emit_timesteps=False, unpack_as_table_signature=True
    )
    return [sample.data for sample in samples]


def test_nstep_adder_sums_discounted_rewards_and_zeroes_discount_at_termination(
    fifo_server: tuple[reverb.Client, str],
) -> None:
    client, table = fifo_server
    adder = NStepTransitionAdder(client, table, n_step=3, discount=0.5, max_in_flight_items=1)
    _episode(adder, [1, 2, 3, 4, 5], terminated=True)
    items = _drain(client, table, 5)
    # t0: 1 + .5*2 + .25*3; t2's window reaches the terminal step, so no bootstrap from there on.
    assert [float(i["reward"]) for i in items] == [2.75, 4.5, 6.25, 6.5, 5.0]
    assert [float(i["discount"]) for i in items] == [0.125, 0.125, 0.0, 0.0, 0.0]
    assert [float(i["next_observation"][0]) for i in items] == [3, 4, 5, 5, 5]
    assert [float(i["action"][0]) for i in items] == [0, 1, 2, 3, 4]


def test_nstep_adder_still_bootstraps_a_truncated_episode(
    fifo_server: tuple[reverb.Client, str],
) -> None:
    client, table = fifo_server
    adder = NStepTransitionAdder(client, table, n_step=3, discount=0.5, max_in_flight_items=1)
    _episode(adder, [1, 1, 1, 1], terminated=False)
    items = _drain(client, table, 4)
    # Shorter windows at the end bootstrap with discount^len(window).
    assert [float(i["discount"]) for i in items] == [0.125, 0.125, 0.25, 0.5]


def test_disabled_insert_blocking_keeps_min_diff_and_lifts_max_diff() -> None:
    config = ReplayConfig(min_replay_size=100, samples_per_insert=8, tolerance=0.5)
    example = transition_example((3,), np.float32, 1)
    table = replay_lib.make_replay_table(config, replay_lib.make_signature(example))
    relaxed = replay_lib.disable_insert_blocking(table).info.rate_limiter_info
    assert relaxed.min_diff == pytest.approx(100 * 8 - config.error_buffer)
    assert relaxed.max_diff == sys.float_info.max


def test_dataset_delivers_batches_from_a_real_server_and_says_ready() -> None:
    env = make_environment(0)
    spec = make_environment_spec(env)
    config = ReplayConfig(batch_size=8, min_replay_size=20, samples_per_insert=4, tolerance=1)
    example = transition_example(spec.observation_shape, spec.observation_dtype, 1)
    table = replay_lib.make_replay_table(config, replay_lib.make_signature(example))
    server = reverb.Server([replay_lib.disable_insert_blocking(table)], port=None)
    try:
        address = f"localhost:{server.port}"
        adder = NStepTransitionAdder(reverb.Client(address), config.table, 1, 0.99, 5)
        adder.add_first(np.zeros(3, np.float32))
        for t in range(40):
            adder.add(np.zeros(1, np.float32), 1.0, np.zeros(3, np.float32), False, t == 39)
        iterator = replay_lib.make_dataset_iterator(address, config)
        batch = next(iterator)
        assert batch.data["observation"].shape == (8, 3)
        assert iterator.retrieved_elements() == 1
        assert wait_until(iterator.ready, timeout_s=10, interval_s=0.01)
    finally:
        server.stop()


# -- the learner's update -----------------------------------------------------
def _batch(rng: np.random.Generator, size: int = 32) -> Transition:
    return Transition(
        observation=rng.normal(size=(size, 3)).astype(np.float32),
        action=rng.uniform(-1, 1, size=(size, 1)).astype(np.float32),
        reward=rng.normal(size=(size,)).astype(np.float32),
        discount=np.full((size,), 0.9, np.float32),
        next_observation=rng.normal(size=(size, 3)).astype(np.float32),
    )


def test_update_is_pure_and_fits_a_fixed_batch() -> None:
    config = TD3Config(hidden_sizes=(32, 32))
    env = make_environment(0)
    networks = make_networks(make_environment_spec(env), config)
    optimizer = optax.adam(1e-3)
    update = jax.jit(make_update_fn(networks, config, optimizer))
    state = make_initial_state(networks, optimizer, jax.random.PRNGKey(0))
    batch = _batch(np.random.default_rng(0))
    again, first = update(state, batch), update(state, batch)
    assert float(again[1]["critic_loss"]) == float(first[1]["critic_loss"])
    losses = []
    for _ in range(60):
        state, metrics = update(state, batch)
        losses.append(float(metrics["critic_loss"]))
    assert losses[-1] < losses[0]
    assert int(state.steps) == 60


# -- the sync loop (Acme's _LearningActor), with fakes ------------------------
class _FakeIterator:
    def __init__(self, ready: list[bool]):
        self._ready = ready

    def ready(self) -> bool:
        return self._ready.pop(0) if self._ready else False


class _FakeTable:
    """`can_sample(n)` from a fixed number of available samples; info counts samples."""

    def __init__(self, available: int):
        self.available = available
        self.completed = 0

    def can_sample(self, num_samples: int) -> bool:
        return self.available >= num_samples

    @property
    def info(self) -> Any:
        completed = self.completed
        stats = type("S", (), {"completed": completed})
        limiter = type("L", (), {"sample_stats": stats})
        return type("I", (), {"rate_limiter_info": limiter})


class _FakeLearner:
    def __init__(self, table: _FakeTable, batch_size: int):
        self.steps = 0
        self._table, self._batch_size = table, batch_size

    def step(self) -> None:
        self.steps += 1
        self._table.completed += self._batch_size
        self._table.available = max(0, self._table.available - self._batch_size)


class _FakeActor:
    def __init__(self) -> None:
        self.updates = 0

    def update(self, wait: bool = False) -> None:
        self.updates += 1


def test_learning_actor_steps_while_the_iterator_is_ready() -> None:
    table, actor = _FakeTable(available=0), _FakeActor()
    learner = _FakeLearner(table, 4)
    LearningActor(actor, learner, _FakeIterator([True, True]), table, 4).update()  # type: ignore[arg-type]
    assert learner.steps == 2 and actor.updates == 1


def test_learning_actor_calls_next_when_only_the_table_can_sample_a_batch() -> None:
    # The seed's loop: not ready, but the table can sample a batch -> step (and next()).
    table, actor = _FakeTable(available=4), _FakeActor()
    learner = _FakeLearner(table, 4)
    LearningActor(actor, learner, _FakeIterator([]), table, 4).update()  # type: ignore[arg-type]
    assert learner.steps == 1


def test_learning_actor_returns_to_the_actor_when_there_is_no_data() -> None:
    table, actor = _FakeTable(available=3), _FakeActor()
    learner = _FakeLearner(table, 4)
    LearningActor(actor, learner, _FakeIterator([]), table, 4).update()  # type: ignore[arg-type]
    assert learner.steps == 0 and actor.updates == 0


def test_learning_actor_steps_the_learner_inside_the_probes_wait() -> None:
    # Sync mode: the loop's actor waits on the learner while it steps (same thread).
    table, actor, probe = _FakeTable(available=8), _FakeActor(), ActorProbe(name="loop")
    learner = _FakeLearner(table, 4)
    seen: list[Any] = []
    learner.step = lambda: (seen.append(probe.snapshot()["waiting_on"]),  # type: ignore[method-assign]
                            _FakeLearner.step(learner))
    LearningActor(actor, learner, _FakeIterator([]), table, 4,  # type: ignore[arg-type]
                  waiting=lambda: probe.waiting("learner")).update()
    assert seen == ["learner", "learner"] and probe.snapshot()["waits_total"] == 2
    assert probe.snapshot()["waiting"] is False


class _Learner:
    """A learner's step count as `PolicyLagBound` reads it, advanced by the test."""

    def __init__(self, steps: int = 0):
        self.steps = steps
        self.calls: list[tuple[int, float]] = []
        self.advance_on_wait: int | None = None

    def __call__(self, after: int, timeout_s: float) -> int:
        self.calls.append((after, timeout_s))
        if timeout_s and self.advance_on_wait is not None and len(self.calls) >= 3:
            self.steps = self.advance_on_wait
        return self.steps


def test_policy_lag_bound_never_waits_during_warmup_or_while_the_learner_steps() -> None:
    learner, fetched, probe = _Learner(0), [], ActorProbe(name="actor-0")
    bound = PolicyLagBound(3, learner, lambda: probe.waiting("learner"),
                           lambda: fetched.append(1))
    for _ in range(9):  # warm-up: the learner has not stepped
        bound.after_step()
    assert learner.calls == [(0, 0.0)] * 3 and not fetched
    for steps in (5, 9):  # it steps between checks
        learner.steps = steps
        for _ in range(3):
            bound.after_step()
    assert learner.calls[-2:] == [(0, 0.0), (5, 0.0)] and not fetched
    assert probe.snapshot()["waits_total"] == 0


def test_policy_lag_bound_waits_in_the_probe_until_the_learner_steps_then_fetches() -> None:
    learner, fetched, probe = _Learner(7), [], ActorProbe(name="actor-0")
    bound = PolicyLagBound(2, learner, lambda: probe.waiting("learner"),
                           lambda: fetched.append(probe.snapshot()["waiting_on"]))
    bound.after_step(), bound.after_step()  # sees 7
    learner.advance_on_wait = 8
    bound.after_step(), bound.after_step()  # 7 again: waits until 8
    assert learner.calls == [(0, 0.0), (7, 0.0), (7, 1.0)] and learner.steps == 8
    assert fetched == ["learner"] and probe.snapshot()["waits_total"] == 1
    assert PolicyLagBound(0, learner, probe.waiting, lambda: None).after_step() is None
    assert len(learner.calls) == 3  # 0: off, never asks


def test_a_slow_down_multiplies_the_step_delay_after_its_time_over_its_ramp() -> None:
    delay = StepDelay.parse(0.02, "10@240:90")
    assert (delay.factor, delay.after_s, delay.ramp_s) == (10.0, 240.0, 90.0)
    assert delay.at(0.0) == delay.at(240.0) == 0.02
    assert delay.at(285.0) == pytest.approx(0.11)  # half-way up the ramp
    assert delay.at(400.0) == pytest.approx(0.2)
    assert StepDelay.parse(0.02, "5@60").at(61.0) == pytest.approx(0.1)  # no ramp: at once
    assert StepDelay.parse(0.0, None).at(1e6) == 0.0


def test_a_paced_slow_down_divides_the_loops_rate_by_its_factor() -> None:
    delay = StepDelay.parse(0.0, "2x@100")
    assert delay.paced and delay.factor == 2.0 and delay.at(500.0) == 0.0
    pacer = Pacer(delay)
    # A loop stepping every 0.1 s (whatever its steps cost) until 100 s ...
    assert all(pacer.wait(t / 10) == 0.0 for t in range(0, 1001))
    # ... then every 0.2 s: each step waits out the rest of twice the interval before.
    elapsed, starts = 100.05, []
    for _ in range(50):
        elapsed += pacer.wait(elapsed)
        starts.append(elapsed)
        elapsed += 0.05  # the loop's own work
    assert (starts[-1] - starts[0]) / 49 == pytest.approx(0.2)


@pytest.mark.parametrize("argv,message", [
    (["--slow-down", "10@240"], "multiplies --env-step-delay-s, which is 0"),
    (["--slow-down", "2x@240:30"], "a paced slow-down has no ramp"),
    (["--env-step-delay-s", "0.02", "--slow-down", "ten@240"], "FACTOR@SECONDS[:RAMP]"),
    (["--queue"], "--queue needs --mode distributed"),
    (["--checkpoint-every-s", "-1"], "checkpoint_every_s (-1.0) must be >= 0"),
])
def test_bench_long_flags_reject_bad_values_in_one_line(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        configs_from_args(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_long_flags_reach_the_configs() -> None:
    _, replay, run = configs_from_args(
        ["--mode", "distributed", "--queue", "--env-step-delay-s", "0.02", "--slow-down",
         "10@240:90", "--checkpoint-every-s", "120"])
    assert replay.queue and run.checkpoint_every_s == 120.0
    assert run.env_step_delay == StepDelay(0.02, 10.0, 240.0, 90.0)


def test_a_queue_replay_table_has_the_queue_limiter() -> None:
    spec = make_environment_spec(make_environment(0))
    example = transition_example(spec.observation_shape, spec.observation_dtype,
                                 spec.action_size)
    table = replay_lib.make_replay_table(ReplayConfig(queue=True, max_replay_size=64,
                                                      min_replay_size=1, tolerance=1.0),
                                         replay_lib.make_signature(example))
    server = reverb.Server([table])
    try:
        info = reverb.Client(f"localhost:{server.port}").server_info(timeout=5)
        limiter = info[ReplayConfig().table].rate_limiter_info
        assert (limiter.samples_per_insert, limiter.min_size_to_sample, limiter.min_diff,
                limiter.max_diff) == (1.0, 1, 0.0, 64.0)
        assert info[ReplayConfig().table].max_times_sampled == 1
    finally:
        server.stop()


def test_a_delayed_environment_sleeps_before_each_step() -> None:
    env = make_environment(0, delay=StepDelay(0.05))
    t0 = time.monotonic()
    for _ in range(4):
        env.step(env.action_space.sample())
    assert time.monotonic() - t0 >= 0.2
