"""`replaywatch predict --rllib`: an RLlib DQN configuration's replay ratio and warm-up, from
the command line (the arithmetic: tests/test_rllib_ratio.py; real runs: bench/RESULTS.md)."""

from __future__ import annotations

import json

import pytest

from replaywatch.cli import main


def predict(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["predict", "--rllib", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_an_intensity_rllib_miscounts_is_off_with_the_intensity_that_trains_as_asked(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = predict(["--train-batch-size", "32", "--num-env-runners", "1",
                            "--training-intensity", "4"], capsys)
    assert code == 1
    assert out.splitlines()[0] == ("replay ratio: OFF: trains 8 env steps per env step "
                                   "sampled (training_intensity 4)")
    assert "fix: training_intensity=2 trains at 4" in out


def test_the_json_document_names_the_weights_and_the_fix(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = predict(["--train-batch-size", "32", "--num-env-runners", "1",
                            "--training-intensity", "4", "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["weights"] == {"store": 4, "train": 1}
    assert doc["fix"] == {"knob": "training_intensity", "value": 2.0, "trains_at": 4.0}


def test_no_intensity_is_the_natural_ratio_and_exit_0(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = predict(["--train-batch-size", "32", "--num-env-runners", "2"], capsys)
    assert code == 0 and out.startswith("replay ratio: natural (no training_intensity): "
                                        "trains 16 ")


def test_a_ratio_no_whole_rounds_reach_says_what_to_change_and_the_warm_up(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = predict(["--train-batch-size", "32", "--num-env-runners", "1",
                            "--rollout-fragment-length", "10", "--training-intensity", "5",
                            "--capacity", "1000", "--learning-starts", "5000"], capsys)
    assert code == 1
    assert "change train_batch_size or rollout_fragment_length" in out
    assert "it starts, on the last 1000 only" in out


@pytest.mark.parametrize("argv, message", [
    ([], "--rllib needs --train-batch-size"),
    (["--train-batch-size", "32", "--rollout-fragment-length", "x"],
     "--rollout-fragment-length 'x' is not a number or auto"),
    (["--train-batch-size", "0"], "train_batch_size must be at least 1"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = predict(argv, capsys)
    assert code == 2 and out == "" and message in err and len(err.splitlines()) == 1
