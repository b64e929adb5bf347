"""`replaywatch predict`: the budget model from the command line, before a job starts.

    replaywatch predict --samples-per-insert 128 --min-size-to-sample 2000 \
        --error-buffer 25600 --batch-size 256 --num-parallel-calls 12 --layout sync
    replaywatch predict --reverb HOST:PORT --table replay --batch-size 256 \
        --num-parallel-calls 12 --layout sync

The limiter comes from flags (`--error-buffer`, or `--min-diff`/`--max-diff` for other
limiters), a TOML file (`--config`, a [predict] table with the same names), or a running
server's ServerInfo (`--reverb`). Exit 0 safe, 1 can_hang or will_hang, 2 bad input. No
server is started and no TensorFlow is imported: it answers in well under a second.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import IO, Any

from replaywatch import predict_rllib
from replaywatch.config import parse_address, read_toml
from replaywatch.diagnosis import budget, budget_fixes, budget_terms, budget_words
from replaywatch.diagnosis.budget import Batching, JobLayout
from replaywatch.diagnosis.budget_reasons import Verdict
from replaywatch.diagnosis.rules_checkpoint import UNRESTORABLE_FIX
from replaywatch.diagnosis.rules_config import limiter_of
from replaywatch.errors import ConfigError, SourceError
from replaywatch.probe.protocol import Gate
from replaywatch.probe.protocol import Layout as Kind

INT_KEYS = ("min_size_to_sample", "batch_size", "num_parallel_calls", "max_in_flight",
            "prefetch", "max_policy_lag", "iterators_per_worker", "item_bytes",
            "first_step_at", "max_items_ahead", "cycle_length", "workers_per_iterator",
            "max_size")
FLOAT_KEYS = ("samples_per_insert", "error_buffer", "min_diff", "max_diff", "inserts_per_step",
              "checkpoint_every_s")
STR_KEYS = ("layout", "gate", "pipeline", "memory_limit", "checkpoint_dir")
CHECKPOINT_KEYS = ("checkpoint_every_s", "checkpoint_dir")
SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
              "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
FIT_SHARE = 0.9  # as memory_exhaustion's fix: a tenth of the limit left to the process
LAYOUTS = tuple(kind.value for kind in Kind)
GATE_FLAGS = {gate.replace("_", "-"): gate for gate in Gate}  # --gate can-sample, schedule
# Each framework's own pipeline: Acme's make_reverb_dataset batches per worker (in flight
# 2 x batch); TF-Agents' as_dataset interleaves min(B, 32) datasets (3 x B / cycle in
# flight each) and batches once after the interleave.
PIPELINES = {"acme": Batching.PER_WORKER, "tf-agents": Batching.AFTER_INTERLEAVE}
VERDICT_WORDS = {Verdict.SAFE: "safe", Verdict.CAN_HANG: "CAN HANG",
                 Verdict.WILL_HANG: "WILL HANG"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--samples-per-insert", type=float, metavar="SPI")
    p.add_argument("--min-size-to-sample", type=int, metavar="N")
    p.add_argument("--error-buffer", type=float, metavar="N",
                   help="SampleToInsertRatio's error_buffer (or give --min-diff/--max-diff)")
    p.add_argument("--min-diff", type=float, metavar="N")
    p.add_argument("--max-diff", type=float, metavar="N")
    p.add_argument("--batch-size", type=int, metavar="B")
    p.add_argument("--num-parallel-calls", type=int, metavar="P")
    p.add_argument("--layout", choices=LAYOUTS,
                   help="sync (insert blocking disabled, Acme's LocalLayout), sync-ratio (one "
                        "loop, finite max_diff), async, async-lag (actors wait on the learner)")
    p.add_argument("--max-in-flight", type=int, metavar="M",
                   help="max_in_flight_samples_per_worker (default 2 x batch size)")
    p.add_argument("--prefetch", type=int, metavar="N")
    p.add_argument("--max-policy-lag", type=int, metavar="L",
                   help="async-lag: items an actor inserts after it last saw a learner step, "
                        "then it waits for the next one")
    p.add_argument("--max-items-ahead", type=int, metavar="N",
                   help="async-lag: items the actors may insert ahead of what the learner "
                        "consumed (inserts - min_size <= N + consumed samples / spi)")
    p.add_argument("--gate", choices=tuple(GATE_FLAGS),
                   help="sync: when the loop calls next(): can-sample (only while "
                        "can_sample(batch) or ready(), Acme's LocalLayout) or schedule (every "
                        "--inserts-per-step inserts from --first-step-at items on); left out, "
                        "both are judged and the worse is given")
    p.add_argument("--inserts-per-step", type=float, metavar="K",
                   help="schedule: inserts between learner steps (default batch / spi)")
    p.add_argument("--first-step-at", type=int, metavar="M",
                   help="schedule: items in the table at the first learner step (default "
                        "min_size_to_sample)")
    p.add_argument("--pipeline", choices=tuple(PIPELINES),
                   help="acme: per-worker batching (default); tf-agents: min(B, 32) Reverb "
                        "datasets, one batch after the interleave")
    p.add_argument("--batch-after-interleave", action="store_true",
                   help="one batch after the interleave, as TF-Agents' as_dataset")
    p.add_argument("--cycle-length", type=int, metavar="C",
                   help="after the interleave: Reverb datasets interleaved (default "
                        "min(B, 32))")
    p.add_argument("--workers-per-iterator", type=int, metavar="N",
                   help="num_workers_per_iterator of each Reverb dataset (default 1)")
    p.add_argument("--iterators-per-worker", type=int, metavar="N",
                   help="3 for Acme's make_reverb_dataset before acme dea9307 (default 1)")
    p.add_argument("--item-bytes", type=int, metavar="N")
    p.add_argument("--max-size", type=int, metavar="N",
                   help="the table's max_size: with --memory-limit, whether it fits")
    p.add_argument("--memory-limit", metavar="SIZE",
                   help="the replay process's memory limit (24GiB, 512MiB, bytes)")
    p.add_argument("--checkpoint-every-s", type=float, metavar="S",
                   help="the replay checkpoints every S seconds: whether a restart restores it")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="the checkpointer's directory (none: Reverb's default, a temporary one)")
    p.add_argument("--reverb", metavar="HOST:PORT", help="read the limiter from this server")
    p.add_argument("--table", metavar="NAME", help="with --reverb: the table (default: its "
                   "only table)")
    p.add_argument("--probe", metavar="URL",
                   help="a running TrainerProbe: the dataset as it read it from the tf.data "
                        "graph (else as declared) and the loop's gate, where flags leave "
                        "them out")
    p.add_argument("--config", metavar="FILE", help="TOML file with a [predict] table")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    predict_rllib.add_arguments(p)


def settings(args: argparse.Namespace) -> dict[str, Any]:
    """Flags over the config file's [predict] table."""
    found: dict[str, Any] = _config_file(args.config) if args.config else {}
    for key in (*INT_KEYS, *FLOAT_KEYS, *STR_KEYS):
        value = getattr(args, key)
        if value is not None:
            found[key] = value
    if args.batch_after_interleave:
        if found.get("pipeline", "tf-agents") != "tf-agents":
            raise ConfigError("--batch-after-interleave is TF-Agents' shape, not --pipeline "
                              f"{found['pipeline']}")
        found["pipeline"] = "tf-agents"
    return found


def _config_file(path: str) -> dict[str, Any]:
    section = read_toml(path, allowed=("predict",)).get("predict")
    if not isinstance(section, dict):
        raise ConfigError(f"config file {path}: needs a [predict] table")
    known = set(INT_KEYS) | set(FLOAT_KEYS) | set(STR_KEYS)
    out: dict[str, Any] = {}
    for key, value in section.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"config file {path}: unknown key {key!r} in [predict]")
        kind: type = int if name in INT_KEYS else float if name in FLOAT_KEYS else str
        if isinstance(value, bool) or not isinstance(value, (int, float, str)) or (
                kind is int and not isinstance(value, int)):
            raise ConfigError(f"config file {path}: {key} ({value!r}) must be a "
                              f"{kind.__name__}")
        out[name] = kind(value)
    return out


def limiter_from(s: dict[str, Any], server: budget.Limiter | None) -> budget.Limiter:
    if server is not None:
        return server
    for key in ("samples_per_insert", "min_size_to_sample"):
        if key not in s:
            raise ConfigError(f"--{key.replace('_', '-')} is required (or --reverb)")
    spi, min_size = s["samples_per_insert"], s["min_size_to_sample"]
    if not spi > 0:
        raise ConfigError(f"--samples-per-insert ({spi:g}) must be > 0")
    if min_size < 1:
        raise ConfigError(f"--min-size-to-sample ({min_size}) must be >= 1")
    if "error_buffer" in s:
        if "min_diff" in s or "max_diff" in s:
            raise ConfigError("give --error-buffer or --min-diff/--max-diff, not both")
        if not s["error_buffer"] >= 0:
            raise ConfigError(f"--error-buffer ({s['error_buffer']:g}) must be >= 0")
        return budget.Limiter.ratio(spi, min_size, s["error_buffer"],
                                    insert_blocking=s.get("layout") != Kind.SYNC)
    if "min_diff" not in s or "max_diff" not in s:
        raise ConfigError("give --error-buffer, or both --min-diff and --max-diff")
    if s["max_diff"] < s["min_diff"]:
        raise ConfigError(f"--max-diff ({s['max_diff']:g}) must be >= --min-diff "
                          f"({s['min_diff']:g})")
    return budget.Limiter(spi, min_size, s["min_diff"], s["max_diff"])


def dataset_from(s: dict[str, Any]) -> budget.Dataset:
    for key in ("batch_size", "num_parallel_calls"):
        if key not in s:
            raise ConfigError(f"--{key.replace('_', '-')} is required")
    for key in INT_KEYS:
        if key in s and s[key] < (0 if key == "prefetch" else 1):
            raise ConfigError(f"--{key.replace('_', '-')} ({s[key]}) must be "
                              f"{'>= 0' if key == 'prefetch' else '>= 1'}")
    pipeline = s.get("pipeline", "acme")
    if pipeline not in PIPELINES:
        raise ConfigError(f"pipeline {pipeline!r} must be one of {', '.join(PIPELINES)}")
    shape = PIPELINES[pipeline]
    if shape == Batching.PER_WORKER and "cycle_length" in s:
        raise ConfigError("--cycle-length is for a batch after the interleave "
                          "(--pipeline tf-agents)")
    return budget.Dataset(s["num_parallel_calls"], s["batch_size"], s.get("max_in_flight"),
                          s.get("prefetch", 0), s.get("iterators_per_worker", 1),
                          s.get("item_bytes"), shape, s.get("cycle_length"),
                          s.get("workers_per_iterator", 1))


def layout_from(s: dict[str, Any]) -> JobLayout:
    kind = s.get("layout")
    if kind is None:
        raise ConfigError(f"--layout is required: one of {', '.join(LAYOUTS)}")
    bounds = [k for k in ("max_policy_lag", "max_items_ahead") if k in s]
    if kind == Kind.ASYNC_LAG and len(bounds) != 1:
        raise ConfigError("--layout async-lag needs one of --max-policy-lag, --max-items-ahead")
    if kind != Kind.ASYNC_LAG and bounds:
        raise ConfigError(f"--{bounds[0].replace('_', '-')} is for --layout async-lag, "
                          f"not {kind}")
    flag = s.get("gate")
    if flag is not None and flag not in GATE_FLAGS:
        raise ConfigError(f"gate {flag!r} must be one of {', '.join(GATE_FLAGS)}")
    gate = GATE_FLAGS[flag] if flag else None
    schedule = [k for k in ("inserts_per_step", "first_step_at") if k in s]
    synchronous = kind in (Kind.SYNC, Kind.SYNC_RATIO)
    if gate is not None and not synchronous:
        raise ConfigError(f"--gate is for a synchronous loop (--layout sync), not {kind}")
    if schedule and (not synchronous or gate == Gate.CAN_SAMPLE):
        raise ConfigError(f"--{schedule[0].replace('_', '-')} is for a loop that steps on a "
                          "schedule (--layout sync, --gate schedule or left out)")
    return JobLayout(kind, s.get("max_policy_lag"), gate, s.get("inserts_per_step"),
                     s.get("first_step_at"), s.get("max_items_ahead"))


def server_table(address: str, table: str | None, timeout_s: float = 2.0
                 ) -> tuple[budget.Limiter, int | None, int]:
    """The named (or only) table's limiter, item size (by its signature) and max_size from a
    running server's ServerInfo."""
    # Imported here: grpc costs a few hundred ms that the offline form never pays.
    from replaywatch.sources.reverb import ReverbSource, snapshots_from_response

    source = ReverbSource(parse_address(address, "--reverb"), timeout_s)
    try:
        tables = snapshots_from_response(source.fetch(), source.name, time.time())
    except SourceError as e:
        raise ConfigError(str(e)) from None
    finally:
        source.close()
    names = [t.name for t in tables]
    if table is None and len(tables) != 1:
        raise ConfigError(f"--reverb {address} has tables {names}: name one with --table")
    chosen = next((t for t in tables if table is None or t.name == table), None)
    if chosen is None:
        raise ConfigError(f"--reverb {address} has no table {table!r} (tables: {names})")
    return limiter_of(chosen), chosen.item_bytes, chosen.max_size


def memory_bytes(text: str) -> int:
    """`24GiB`, `512MiB`, `1.5GB` or bytes; ConfigError otherwise."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    if m is None or m.group(2).lower() not in SIZE_UNITS or float(m.group(1)) <= 0:
        raise ConfigError(f"--memory-limit {text!r}: a size such as 24GiB, 512MiB or bytes")
    return int(float(m.group(1)) * SIZE_UNITS[m.group(2).lower()])


def memory_fit(max_size: int, item_bytes: int, limit: int) -> dict[str, Any]:
    """Whether `max_size` items of `item_bytes` fit under the limit (the items alone: the
    process's own memory comes on top), and the largest max_size that leaves a tenth."""
    projected = max_size * item_bytes
    return {"max_size": max_size, "item_bytes": item_bytes, "limit_bytes": limit,
            "projected_bytes": projected, "fits": projected <= FIT_SHARE * limit,
            "fits_max_size": int(FIT_SHARE * limit // item_bytes)}


def render_memory(m: dict[str, Any], out: IO[str]) -> None:
    gib = float(1 << 30)
    words = "fits" if m["fits"] else "does not fit"
    print(f"memory: {words}: {m['max_size']:,} items of {m['item_bytes']:,} bytes take "
          f"{m['projected_bytes'] / gib:.1f} GiB against a limit of {m['limit_bytes'] / gib:.1f} "
          f"GiB (the items alone; chunks are compressed and shared, so the signature's size "
          f"is an upper bound); fits up to max_size={m['fits_max_size']:,} "
          f"({FIT_SHARE:.0%} of the limit)", file=out)


def document(lim: budget.Limiter, ds: budget.Dataset, layout: JobLayout
             ) -> dict[str, Any]:
    """The `--json` document: verdict, budget, strandable, what keeps the verdict from a
    better one, fixes (and what they rest on)."""
    b = budget.predict(lim, ds, layout)
    return {"verdict": b.verdict, "budget": b.released, "strandable": b.strandable,
            "safe_from": b.needed, "reason": budget_words.reason(b),
            "conservative": [t.document() for t in budget_terms.explain(lim, ds, layout)],
            "fixes": [f.document() for f in budget_fixes.fixes(lim, ds, layout.for_fixes(lim))],
            "limiter": {"samples_per_insert": lim.samples_per_insert,
                        "min_size_to_sample": lim.min_size_to_sample,
                        "min_diff": lim.min_diff,
                        "max_diff": None if lim.max_diff == float("inf") else lim.max_diff,
                        "error_buffer": lim.error_buffer,
                        "insert_blocking_disabled": lim.insert_blocking_disabled},
            "dataset": {"num_parallel_calls": ds.workers, "batch_size": ds.batch_size,
                        "max_in_flight": ds.in_flight, "prefetch": ds.prefetch,
                        "iterators_per_worker": ds.iterators_per_worker,
                        "item_bytes": ds.item_bytes, "batch": ds.shape,
                        "samplers": ds.samplers,
                        "workers_per_iterator": ds.workers_per_iterator},
            "layout": layout.kind, "max_policy_lag": layout.max_policy_lag,
            "max_items_ahead": layout.max_items_ahead,
            "gate": layout.loop_gate if layout.synchronous else None,
            "judged_gate": b.gate, "inserts_per_step": layout.inserts_per_step,
            "first_step_at": layout.first_step_at}


def render_text(doc: dict[str, Any], out: IO[str]) -> None:
    released = "never stops" if doc["budget"] is None else f"{doc['budget']:g}"
    gate = ""
    if doc["layout"] in (Kind.SYNC, Kind.SYNC_RATIO):
        gate = (f", gate {doc['gate']}" if doc["gate"] else
                f", gate unknown: judged as {doc['judged_gate']}, the worse reading")
    print(f"verdict: {VERDICT_WORDS[Verdict(doc['verdict'])]} ({doc['layout']}{gate})", file=out)
    print(f"  released when inserting stops: {released} samples ({doc['reason']})", file=out)
    print(f"  strandable without a complete batch: {doc['strandable']:g} samples (safe from "
          f"{doc['safe_from']:g} released)", file=out)
    if doc["conservative"]:
        print("  conservative: what the model cannot decide, and what settles it:", file=out)
        for t in doc["conservative"]:
            kind = "a race" if t["race"] else "not told"
            print(f"    {t['term']} ({kind}): {t['why']}; settled by {t['settled_by']}",
                  file=out)
    if doc["fixes"]:
        print("fixes the model proves (any one):", file=out)
        for f in doc["fixes"]:
            print(f"  {_knob(f)}", file=out)
            if "together_with" in f:
                print(f"    together with {_knob(f['together_with'])}", file=out)
    elif doc["verdict"] != Verdict.SAFE:
        print("fixes the model proves: none (no single change it calls safe)", file=out)


def _knob(f: dict[str, Any]) -> str:
    was = f"{f['was']:g}" if isinstance(f["was"], float) else f["was"]
    return f"{f['knob']}={f['value']} (now {was}): {f['cost']}"


def probe_settings(url: str, timeout_s: float = 2.0) -> dict[str, Any]:
    """What a running trainer probe says of the dataset and the loop, in predict's names:
    the pipeline it read from the tf.data graph over what it declares."""
    # Imported here, as for --reverb: the offline form never pays for it.
    from replaywatch.sources.probe_http import get_json, snapshot_from_probe

    try:
        doc = get_json(url.rstrip("/") + "/probe", timeout_s)
        p = snapshot_from_probe(doc, url, time.time())
    except (SourceError, KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"--probe {url}: {e}") from None
    s = p.pipeline  # the read values, the declared ones where the graph did not show them
    found: dict[str, Any] = {
        "batch_size": s.batch_size, "num_parallel_calls": s.num_parallel_calls,
        "max_in_flight": s.max_in_flight, "prefetch": s.prefetch_size,
        "iterators_per_worker": s.iterators_per_worker, "item_bytes": s.item_bytes,
        "cycle_length": s.cycle_length, "workers_per_iterator": s.workers_per_iterator,
        "pipeline": "tf-agents" if s.batch_after_interleave else None,
        "layout": p.layout, "inserts_per_step": p.inserts_per_step,
        "first_step_at": p.first_step_at,
        "gate": None if p.gate is None else Gate(p.gate).replace("_", "-")}
    return {k: v for k, v in found.items() if v is not None}


def run_predict(args: argparse.Namespace, out: IO[str]) -> int:
    if args.rllib:
        return predict_rllib.run(args, out)
    s = settings(args)
    if "checkpoint_dir" in s and "checkpoint_every_s" not in s:
        raise ConfigError("--checkpoint-dir goes with --checkpoint-every-s")
    if "checkpoint_every_s" in s and not s["checkpoint_every_s"] > 0:
        raise ConfigError(f"--checkpoint-every-s ({s['checkpoint_every_s']:g}) must be positive")
    plan = (checkpoint_plan(s["checkpoint_every_s"], s.get("checkpoint_dir"))
            if "checkpoint_every_s" in s else None)
    if plan is not None and not (set(s) - set(CHECKPOINT_KEYS)) and not (
            args.reverb or args.probe):
        return _checkpoints_only(plan, args.json, out)
    if args.probe:
        s = {**probe_settings(args.probe), **s}  # flags win over what the probe says
    server, signature_bytes, max_size = (server_table(args.reverb, args.table) if args.reverb
                                         else (None, None, None))
    if max_size and "max_size" not in s:
        s["max_size"] = max_size
    if signature_bytes and "item_bytes" not in s:
        s["item_bytes"] = signature_bytes
    if server is not None and any(k in s for k in ("samples_per_insert", "error_buffer",
                                                   "min_diff", "max_diff",
                                                   "min_size_to_sample")):
        raise ConfigError("--reverb reads the limiter; leave out the limiter's flags")
    if args.table and not args.reverb:
        raise ConfigError("--table goes with --reverb")
    limit = memory_bytes(s["memory_limit"]) if "memory_limit" in s else None
    if limit is not None and not (s.get("max_size") and s.get("item_bytes")):
        raise ConfigError("--memory-limit needs --max-size and --item-bytes (or --reverb)")
    try:
        doc = document(limiter_from(s, server), dataset_from(s), layout_from(s))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if limit is not None:
        doc["memory"] = memory_fit(s["max_size"], s["item_bytes"], limit)
    if plan is not None:
        doc["checkpoints"] = plan
    if args.json:
        json.dump(doc, out)
        print(file=out)
    else:
        render_text(doc, out)
        if "memory" in doc:
            render_memory(doc["memory"], out)
        if plan is not None:
            render_checkpoints(plan, out)
    fits = doc.get("memory", {}).get("fits", True)
    restorable = plan is None or plan["restorable"]
    return 0 if doc["verdict"] == Verdict.SAFE and fits and restorable else 1


def checkpoint_plan(every_s: float, directory: str | None) -> dict[str, Any]:
    """Whether a restarted replay process finds the checkpoints written every `every_s`:
    not in Reverb's default, a fresh temporary directory per process start (what the
    sidecar names checkpoint_unrestorable once the job runs)."""
    if directory:
        return {"restorable": True, "every_s": every_s, "checkpoint_dir": directory,
                "why": f"a restart loads the newest complete checkpoint in {directory}",
                "fix": None}
    return {"restorable": False, "every_s": every_s, "checkpoint_dir": None,
            "why": "Reverb's default checkpointer writes into a fresh temporary directory each "
                   "time a process starts it: a restarted replay process looks in a new, empty "
                   "one and starts empty, so no checkpoint is ever restored",
            "fix": UNRESTORABLE_FIX}


def render_checkpoints(plan: dict[str, Any], out: IO[str]) -> None:
    words = "restorable" if plan["restorable"] else "checkpoint_unrestorable"
    print(f"checkpoints every {plan['every_s']:g} s: {words}: {plan['why']}.", file=out)
    if plan["fix"]:
        print(f"fix: {plan['fix']}", file=out)


def _checkpoints_only(plan: dict[str, Any], as_json: bool, out: IO[str]) -> int:
    if as_json:
        json.dump({"checkpoints": plan}, out)
        print(file=out)
    else:
        render_checkpoints(plan, out)
    return 0 if plan["restorable"] else 1
