"""`replaywatch predict`: its flags (a contract), its exits, and the same verdict the sidecar
gives live on the same configuration, over every cell of the prediction grid."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.predict_grid import Cell, default_cells, live_verdict, shape_cells
from replaywatch.cli import main
from replaywatch.diagnosis.actors import Actor
from replaywatch.diagnosis.engine import diagnose
from replaywatch.model import FLOAT_MAX
from tests.builders import (
    ACTOR,
    DEFAULT,
    actor_snapshot,
    polls,
    probe_history,
    seconds,
    table_history,
    target_view,
)

SEED = ["--samples-per-insert", "128", "--min-size-to-sample", "2000", "--error-buffer",
        "25600", "--batch-size", "256", "--num-parallel-calls", "12", "--layout", "sync"]


def predict(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["predict", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_seed_numbers_with_one_iterator_per_worker_and_small_items_are_safe(capsys: Any
                                                                              ) -> None:
    code, out, _ = predict([*SEED, "--item-bytes", "16", "--gate", "can-sample"], capsys)
    assert code == 0 and out.startswith("verdict: safe (sync, gate can_sample)")
    assert "25600 samples" in out and "2895 samples" in out
    # The gate left out, the scheduled reading is judged too: 12 x 240 = 2880 < 25600.
    code, out, _ = predict([*SEED, "--item-bytes", "16"], capsys)
    assert code == 0 and out.startswith("verdict: safe (sync, gate unknown")
    assert "as a loop that steps on a schedule" in out and "2880 samples" in out


def test_the_seed_numbers_with_the_item_size_unknown_say_both_readings(capsys: Any) -> None:
    # Small items are safe there, seed-sized frames are not (the grid's seed loop): unknown,
    # the answer says from which size, how to settle it, and offers the fix that holds both.
    code, out, _ = predict(SEED, capsys)
    assert code == 1 and out.startswith("verdict: CAN HANG (sync, gate unknown")
    assert "from 4,113 bytes an item" in out and "--item-bytes" in out
    assert "smaller items: the warm-up reading, safe" in out
    assert "num_parallel_calls=1 (now 12)" in out and "batch_size=" not in out


def test_the_seed_on_acme_interleave_with_frames_can_hang_with_fixes_as_json(capsys: Any
                                                                            ) -> None:
    code, out, _ = predict([*SEED, "--max-in-flight", "512", "--prefetch", "1",
                            "--iterators-per-worker", "3", "--item-bytes", "63504", "--json"],
                           capsys)
    doc = json.loads(out)
    assert code == 1
    assert doc["verdict"] == "can_hang" and doc["budget"] == 25600
    assert doc["strandable"] == 39900
    # Frames answer 17 at a time: past warm-up only one read iterator is safe (a batch of
    # 164, which the warm-up arithmetic passed, hung on the grid's seed loop).
    assert {f["knob"]: f["value"] for f in doc["fixes"]} == {"num_parallel_calls": 1}
    assert all(f["value"] != f["was"] for f in doc["fixes"])


# A scheduled loop of 2 workers of 16, spi 4, min_size 100, error_buffer 24 ran clean where
# the model says can_hang: 24 strand only as 12 and 12, a split the arithmetic cannot rule out
# (budget.py's docstring), so the answer says that is the term, and what settles it.
AT_THE_EDGE = ["--samples-per-insert", "4", "--min-size-to-sample", "100", "--error-buffer", "24",
            "--batch-size", "16", "--num-parallel-calls", "2", "--item-bytes", "16"]


def test_a_can_hang_says_its_race_and_the_fix_that_settles_it(capsys: Any) -> None:
    code, out, _ = predict([*AT_THE_EDGE, "--layout", "sync-ratio"], capsys)
    assert code == 1 and out.startswith("verdict: CAN HANG (sync-ratio, gate schedule)")
    lines = out.splitlines()
    at = lines.index("  conservative: what the model cannot decide, and what settles it:")
    assert lines[at + 1].startswith("    worker_split (a race): which of the 2 batching workers")
    assert "pipeline can hold 24 so, against 24 released" in lines[at + 1]
    assert lines[at + 1].endswith("settled by a change: num_parallel_calls=1 (now 2) or another "
                                  "fix below")
    assert lines[at + 2] == "fixes the model proves (any one):"
    assert "  error_buffer=30 (now 24): " in out


# (name, flags, the terms and whether each is a race, in what settles the first): --json.
TERM_CASES = [
    ("a_scheduled_loop_races_on_the_split", [*AT_THE_EDGE, "--layout", "sync-ratio"],
     [("worker_split", True)], "num_parallel_calls=1 (now 2)"),
    ("the_gate_left_out_is_settled_first_by_declaring_it", [*AT_THE_EDGE, "--layout", "sync"],
     [("gate_unknown", False), ("worker_split", True)], "--gate can-sample"),
    ("the_size_left_out_is_settled_by_declaring_it",
     [*SEED, "--gate", "can-sample"], [("item_size_unknown", False)], "--item-bytes"),
    ("frames_race_on_thin_answers",
     [*SEED, "--gate", "can-sample", "--error-buffer", "50000", "--item-bytes", "63504"],
     [("thin_answers", True)], "num_parallel_calls=1 (now 12)"),
    ("a_safe_verdict_has_no_term", [*AT_THE_EDGE, "--layout", "sync", "--gate", "can-sample"], [],
     None),
]


@pytest.mark.parametrize("name,argv,terms,settles", TERM_CASES, ids=[c[0] for c in TERM_CASES])
def test_the_json_names_each_conservative_term_and_what_settles_it(
        name: str, argv: list[str], terms: list[tuple[str, bool]], settles: str | None,
        capsys: Any) -> None:
    _, out, _ = predict([*argv, "--json"], capsys)
    doc = json.loads(out)
    assert [(t["term"], t["race"]) for t in doc["conservative"]] == terms
    assert all(t["why"] and t["settled_by"] for t in doc["conservative"])
    if settles is not None:
        assert settles in doc["conservative"][0]["settled_by"]
        assert doc["fixes"]  # a conservative answer always comes with a proven fix


def test_a_lag_bound_that_frees_less_than_a_batch_will_hang(capsys: Any) -> None:
    code, out, _ = predict(["--samples-per-insert", "4", "--min-size-to-sample", "1000",
                            "--error-buffer", "32", "--batch-size", "16",
                            "--num-parallel-calls", "4", "--layout", "async-lag",
                            "--max-policy-lag", "3", "--json"], capsys)
    doc = json.loads(out)
    assert code == 1 and doc["verdict"] == "will_hang" and doc["budget"] == 12
    assert {f["knob"]: f["value"] for f in doc["fixes"]} == {"batch_size": 3,
                                                             "max_policy_lag": 16}


def test_min_and_max_diff_stand_for_other_limiters(capsys: Any) -> None:
    code, out, _ = predict(["--samples-per-insert", "4", "--min-size-to-sample", "1000",
                            "--min-diff", "3980", "--max-diff", "4020", "--batch-size", "16",
                            "--num-parallel-calls", "2", "--layout", "sync-ratio", "--json"],
                           capsys)
    assert code == 1 and json.loads(out)["budget"] == 20  # 4 x 1000 - 3980


def test_a_toml_file_gives_the_same_answer_as_the_flags(tmp_path: Path, capsys: Any) -> None:
    f = tmp_path / "job.toml"
    f.write_text("[predict]\nsamples_per_insert = 128\nmin_size_to_sample = 2000\n"
                 "error_buffer = 2560\nbatch_size = 256\nnum_parallel_calls = 12\n"
                 'layout = "sync"\n')
    from_file = predict(["--config", str(f), "--json"], capsys)
    flags = predict([*SEED[:5], "2560", *SEED[6:], "--json"], capsys)
    assert from_file[0] == flags[0] == 1 and json.loads(from_file[1]) == json.loads(flags[1])


@pytest.mark.parametrize("argv,message", [
    (["--batch-size", "16"], "--samples-per-insert is required"),
    ([*SEED[:-2]], "--layout is required"),
    ([*SEED[:-1], "async-lag"], "needs one of --max-policy-lag"),
    ([*SEED, "--max-policy-lag", "3"], "--max-policy-lag is for --layout async-lag"),
    ([*SEED, "--min-diff", "1", "--max-diff", "2"], "not both"),
    ([*SEED[:4], *SEED[6:]], "give --error-buffer, or both --min-diff and --max-diff"),
    ([*SEED, "--num-parallel-calls", "0"], "--num-parallel-calls (0) must be >= 1"),
    ([*SEED, "--table", "replay"], "--table goes with --reverb"),
    (["--reverb", "127.0.0.1:1", *SEED[8:]], "127.0.0.1:1"),
    ([*SEED, "--config", "/nonexistent.toml"], "config file /nonexistent.toml"),
    ([*SEED, "--probe", "http://127.0.0.1:1"], "--probe http://127.0.0.1:1: "),
    ([*SEED, "--gate", "schedule", "--layout", "async"], "--gate is for a synchronous loop"),
    ([*SEED, "--inserts-per-step", "4", "--gate", "can-sample"], "--inserts-per-step is for"),
    ([*SEED, "--cycle-length", "8"], "--cycle-length is for a batch after the interleave"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str, capsys: Any) -> None:
    code = main(["predict", *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_an_unknown_key_in_the_file_is_named(tmp_path: Path, capsys: Any) -> None:
    f = tmp_path / "job.toml"
    f.write_text("[predict]\nbatchsize = 16\n")
    code = main(["predict", "--config", str(f)])
    assert code == 2 and "unknown key 'batchsize'" in capsys.readouterr().err


def test_predict_imports_no_tensorflow_reverb_or_jax() -> None:
    argv = [*SEED, "--item-bytes", "16"]
    code = (f"import sys; from replaywatch.cli import main; rc = main(['predict', *{argv!r}]); "
            "bad = [m for m in ('tensorflow', 'reverb', 'jax') if m in sys.modules]; "
            "print(rc, bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60).stdout.split("\n")[-2]
    assert out == "0 []"


# -- the sidecar's live verdict equals predict's offline one, on every grid cell ---------------

def live_view(cell: Cell) -> Any:
    """What the sidecar sees at the start line: the limiter, the probe's declared dataset,
    the loop's writer (synchronous layouts) or the actors' probes (asynchronous ones)."""
    lim, ds, layout = cell.model()
    times = seconds(5)
    table = table_history(times, 0, 0, spi=cell.spi, min_size=cell.min_size,
                          min_diff=lim.min_diff,
                          max_diff=FLOAT_MAX if lim.insert_blocking_disabled else lim.max_diff)
    synchronous = cell.layout.startswith("sync")
    # The harness's loops declare their gate to the probe (harness/loop_workload.py).
    probe = probe_history(times, 0, workers=cell.workers, batch_size=cell.batch_size,
                          iterators_per_worker=ds.iterators_per_worker, prefetch=None,
                          item_bytes=ds.item_bytes, items_inserted=5 if synchronous else 0,
                          gate=layout.loop_gate if synchronous else None,
                          inserts_per_step=layout.inserts_per_step,
                          first_step_at=layout.first_step_at,
                          batch_after_interleave=ds.after_interleave,
                          cycle_length=cell.cycle_length)
    actors = () if synchronous else (Actor(ACTOR, tuple(
        dataclasses.replace(actor_snapshot(t, 5), max_policy_lag=cell.lag,
                            max_items_ahead=cell.ahead) for t in times),
        polls(times)),)
    view = target_view([table], [probe])
    if not actors:
        return view
    return dataclasses.replace(view, actors={ACTOR: actors[0].history},
                               probe_polls={**view.probe_polls, ACTOR: actors[0].polls})


@pytest.mark.parametrize("cell", [*default_cells(), *shape_cells()], ids=lambda c: c.name)
def test_the_live_verdict_equals_predicts_on_every_grid_cell(cell: Cell) -> None:
    findings = diagnose(live_view(cell), DEFAULT, 1004.0).findings
    argv = [a for a in cell.args() if a not in ("--shape", "--item", cell.shape, cell.item)]
    flags = {"--workers": "--num-parallel-calls", "--min-size": "--min-size-to-sample",
             "after-interleave": "tf-agents"}
    argv = [flags.get(a, a) for a in argv]
    argv += ["--item-bytes", str(cell.model()[1].item_bytes)]
    if cell.shape == "repeat":
        argv += ["--iterators-per-worker", "3"]
    out = io.StringIO()
    from replaywatch.cli import build_parser
    from replaywatch.predict import run_predict
    run_predict(build_parser().parse_args(["predict", *argv, "--json"]), out)
    doc = json.loads(out.getvalue())
    assert live_verdict(findings) == doc["verdict"]
    # And the same terms keep it from a better verdict (deadlock_risk's evidence).
    live = next((f.evidence["conservative"] for f in findings
                 if f.kind in ("deadlock_risk", "batch_exceeds_headroom")), [])
    assert live == [t["term"] for t in doc["conservative"]]


def test_predict_reads_the_limiter_of_a_running_server(reverb_workload: Any) -> None:
    # harness/reverb_workload.py: SampleToInsertRatio spi 4, min_size 1000, error_buffer 20.
    _, address = reverb_workload("--spi", "4", "--min-size", "1000", "--error-buffer", "20",
                                 "--no-load", "--tables", "2")
    argv = ["predict", "--reverb", address, "--batch-size", "16", "--num-parallel-calls", "2",
            "--layout", "sync-ratio", "--json"]
    one_table = subprocess.run([sys.executable, "-m", "replaywatch", *argv],
                               capture_output=True, text=True, timeout=60)
    assert one_table.returncode == 2 and "--table" in one_table.stderr  # two tables: name one
    done = subprocess.run([sys.executable, "-m", "replaywatch", *argv, "--table", "table_1"],
                          capture_output=True, text=True, timeout=60)
    doc = json.loads(done.stdout)
    assert done.returncode == 1 and doc["verdict"] == "can_hang"
    assert doc["budget"] == 20 and doc["limiter"]["min_diff"] == 3980
    flags = subprocess.run([sys.executable, "-m", "replaywatch", "predict",
                            "--samples-per-insert", "4", "--min-size-to-sample", "1000",
                            "--error-buffer", "20", *argv[3:]], capture_output=True, text=True,
                           timeout=60)
    assert json.loads(flags.stdout)["verdict"] == doc["verdict"]


def test_a_pair_fix_is_printed_and_given_as_json(capsys: Any) -> None:
    argv = ["--samples-per-insert", "4", "--min-size-to-sample", "1000", "--error-buffer", "100",
            "--batch-size", "64", "--num-parallel-calls", "2", "--layout", "sync",
            "--iterators-per-worker", "3", "--item-bytes", "63504"]
    code, out, _ = predict(argv, capsys)
    assert code == 1
    assert "num_parallel_calls=1 (now 2)" in out and "together with error_buffer=" in out
    code, out, _ = predict([*argv, "--json"], capsys)
    (fix,) = json.loads(out)["fixes"]
    assert fix["knob"] == "num_parallel_calls" and fix["together_with"]["knob"] == "error_buffer"
