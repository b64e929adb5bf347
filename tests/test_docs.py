"""The docs stay true of the code: the generated blocks, the paths the docs name, the commands.

The finding table (docs/findings.md) and the metric list (docs/operations.md) sit between
markers and are rendered from the code (the kind declaration; the families the collector emits
for a full picture). When a test here fails because a kind or a metric changed, regenerate them
and review the diff:

    .venv/bin/python -m tests.test_docs        # rewrites the docs' generated blocks
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from replaywatch.diagnosis import kinds
from replaywatch.diagnosis.baseline import Baseline
from replaywatch.diagnosis.consumption import Consumption
from replaywatch.diagnosis.figures import TableFigures
from replaywatch.diagnosis.memory import TableMemory
from replaywatch.diagnosis.ratelimiter import derive
from replaywatch.metrics import make_registry, render
from replaywatch.model import BatchStats, Finding, MemorySnapshot, PriorityUpdates, Severity
from replaywatch.ray_model import ActorRole, RayActor, RaySnapshot, RayTask, RllibCounters
from replaywatch.shards import Shard, ShardCounts
from replaywatch.state import Published, SourceStatus
from tests.builders import ACTOR, actor_snapshot, probe_snapshot, table_history

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONTRIBUTOR_DOCS = ("ARCHITECTURE.md", "CONTRIBUTING.md")
# The user's guides README links to; each generated block lives in one of them.
GUIDES = tuple(sorted((ROOT / "docs").glob("*.md")))
FINDINGS = ROOT / "docs" / "findings.md"
OPERATIONS = ROOT / "docs" / "operations.md"
GENERATED = {"kinds": FINDINGS, "metrics": OPERATIONS}
# A backticked repository path: a file of these kinds, or a directory (trailing slash).
PREFIX = "replaywatch_"
PATH = re.compile(r"`([A-Za-z0-9_.][\w./-]*(?:\.py|\.md|\.yml|\.json|/))`")
# A relative markdown link: [text](path).
LINK = re.compile(r"\]\((?!https?:|#)([^)#\s]+)(?:#[^)]*)?\)")


def block(text: str, name: str) -> str:
    """The text between `<!-- name:begin -->` and `<!-- name:end -->`, stripped."""
    found = re.search(rf"<!-- {name}:begin -->\n(.*?)\n?<!-- {name}:end -->", text, re.DOTALL)
    where = GENERATED[name].relative_to(ROOT)
    assert found, f"{where} has no <!-- {name}:begin --> ... <!-- {name}:end --> block"
    return found.group(1).strip()


def full_picture() -> Published:
    """A published state with every part the collector reads: targets, a table, a probe,
    a finding, so that every family it can emit has a sample (and so its label names)."""
    target, url = "127.0.0.1:1", "http://127.0.0.1:2"
    history = table_history([0.0, 1.0, 2.0], [10, 20, 30], [5, 15, 25], target=target)
    table = history[-1]
    sources = {
        target: SourceStatus(target, "reverb", target, True, 2.0, 2.0, None, 0.001, 0, 3, 0, 1),
        url: SourceStatus(url, "probe", target, True, 2.0, 2.0, None, 0.002, 0, 3, 0, 0),
        ACTOR: SourceStatus(ACTOR, "probe", target, True, 2.0, 2.0, None, 0.002, 0, 3, 0, 0),
    }
    probe = dataclasses.replace(
        probe_snapshot(2.0, 40, url=url, blocked_for=1.0, ready=True, table=table.name),
        priority_updates=(PriorityUpdates(table.name, 4, 1024, 0.2, 1, 1, 0, "NaN"),),
        batch_stats=BatchStats(40, 40 * 256, 0, 0, 0, 25.0, 30, 1.2, 1.0, 2))
    finding = Finding("worker_starvation", Severity.CRITICAL, target, table.name, "s", {}, "f",
                      1.0, 2.0)
    key = (target, table.name)
    figures = TableFigures(
        *key, derived=derive(history),
        baselines={"inserts": Baseline(100.0, 5.0, 600.0, 50.0)},
        memory=TableMemory(74_787.0, "measured over 3000 items", True, 300 << 20,
                           2.0 * (1 << 30), 1 << 30, 9_000),
        consumption=Consumption(4.0, 4.1, 4.0, 48.0, 0.5, 60.0))
    dashboard = "http://127.0.0.1:8265"
    sources[dashboard] = SourceStatus(dashboard, "ray", dashboard, True, 2.0, 2.0, None, 0.01, 0,
                                      3, 0, 0)
    ray = RaySnapshot(
        dashboard, 2.0, "02000000", 77,
        actors=(RayActor("a1", "SingleAgentEnvRunner", ActorRole.ENV_RUNNER, "ALIVE", 1, None,
                         78, "n", "02000000"),),
        tasks=(RayTask("SingleAgentEnvRunner.apply", ActorRole.ENV_RUNNER, 78, "w", "02000000",
                       1.5),),
        counters=(RllibCounters("w", "SingleAgentEnvRunner", ActorRole.ENV_RUNNER, True,
                                env_steps_sampled=100.0),
                  RllibCounters("x", "_WrappedExecutable", ActorRole.LEARNER, True,
                                env_steps_trained=64.0, circular_buffer_dropped=3.0)))
    return Published(at=2.0, cycle=3, sources=sources, tables={key: table}, ray={dashboard: ray},
                     figures={key: figures}, probes={url: probe},
                     actors={ACTOR: actor_snapshot(2.0, 30, in_call="flush", blocked_for=1.0)},
                     findings=(finding,), late_cycles=1, incident_log_dropped=1,
                     shard=ShardCounts(Shard(0, 2), 3, 4),
                     memory={target: MemorySnapshot(target, 2.0, 77, 300 << 20, 1 << 30,
                                                    "cgroup v1", 350 << 20, 0,
                                                    "listening on port 8000", 280 << 20)})


def metrics_table() -> str:
    """docs/operations.md's metric list: every family the collector emits, grouped by labels.

    Names drop the common `replaywatch_` prefix; `/metrics` itself has each one's help text.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for family in make_registry(full_picture).collect():
        assert family.samples, f"{family.name}: the full picture gives it no sample"
        name = family.name + ("_total" if family.type == "counter" else "")
        groups.setdefault(tuple(family.samples[0].labels), []).append(name)
    rows = ["| labels | metrics (each prefixed `replaywatch_`) |", "| --- | --- |"]
    for labels, names in groups.items():
        shown = ", ".join(f"`{n.removeprefix(PREFIX)}`" for n in names)
        rows.append(f"| {', '.join(f'`{k}`' for k in labels) or 'none'} | {shown} |")
    return "\n".join(rows)


def emitted_names() -> list[str]:
    """Every `# TYPE` name in the exposition of the full picture."""
    text = render(make_registry(full_picture)).decode()
    return [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]


def test_the_finding_table_is_the_declarations_rendering() -> None:
    assert block(FINDINGS.read_text(), "kinds") == kinds.markdown_table(), (
        "docs/findings.md's finding table differs from kinds.markdown_table(); "
        "run .venv/bin/python -m tests.test_docs")


def test_the_metric_list_is_every_family_the_collector_emits() -> None:
    rows = block(OPERATIONS.read_text(), "metrics").splitlines()[2:]
    listed = [PREFIX + n for row in rows for n in re.findall(r"`(\w+)`", row.split(" | ")[1])]
    assert sorted(listed) == sorted(emitted_names())
    assert block(OPERATIONS.read_text(), "metrics") == metrics_table(), (
        "docs/operations.md's metric list differs from the collector; "
        "run .venv/bin/python -m tests.test_docs")


def test_each_generated_block_is_in_one_doc_only() -> None:
    # A copy left behind in README (or another guide) would go stale unchecked.
    for name, home in GENERATED.items():
        holders = [d.relative_to(ROOT).as_posix() for d in (README, *GUIDES)
                   if f"<!-- {name}:begin -->" in d.read_text()]
        assert holders == [home.relative_to(ROOT).as_posix()], (name, holders)


def test_the_metric_picture_really_reaches_every_family() -> None:
    # The check above is only as good as this picture: it must reach the families that are
    # emitted only for a probe, a table, a finding or a source.
    names = emitted_names()
    for needed in ("replaywatch_probe_iterator_ready", "replaywatch_table_can_sample",
                   "replaywatch_finding_active", "replaywatch_late_polls_total",
                   "replaywatch_late_poll_cycles_total", "replaywatch_target_up"):
        assert needed in names
    assert len(names) == len(set(names))


def test_every_path_the_docs_name_exists() -> None:
    # A backticked path is named from the repository's root; a link, as Markdown reads it,
    # from the directory of the doc that holds it.
    assert {g.name for g in GUIDES} >= {"attach.md", "predict.md", "memory.md",
                                        "replay-health.md", "findings.md", "operations.md"}
    for doc in (*(ROOT / d for d in CONTRIBUTOR_DOCS), README, *GUIDES):
        text, name = doc.read_text(), doc.relative_to(ROOT)
        paths, links = PATH.findall(text), LINK.findall(text)
        assert paths + links, f"{name} names no path"
        missing = [p for p in paths if not (ROOT / p).exists()]
        missing += [p for p in links if not (doc.parent / p).exists()]
        assert missing == [], f"{name} names paths that do not exist: {missing}"


def test_readme_links_every_guide() -> None:
    linked = {(ROOT / p).resolve() for p in LINK.findall(README.read_text())}
    assert [g.name for g in GUIDES if g.resolve() not in linked] == []


def test_the_path_pattern_finds_files_and_directories_only() -> None:
    text = "`replaywatch/poller.py` `docs/runbooks/` `make test` `a.yml` `x.toml` `--probe`"
    assert PATH.findall(text) == ["replaywatch/poller.py", "docs/runbooks/", "a.yml"]
    links = "[a](bench/RESULTS.md) [b](https://x.org/y.md) [c](#top) [d](docs/x.md#part)"
    assert LINK.findall(links) == ["bench/RESULTS.md", "docs/x.md"]


def test_readme_commands_are_makefile_targets() -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert {"demo", "test", "test-fast"} <= set(re.findall(r"\bmake ([\w-]+)", README.read_text()))
    for doc in (README, *GUIDES):
        commands = set(re.findall(r"\bmake ([\w-]+)", doc.read_text()))
        assert commands <= targets, f"{doc.relative_to(ROOT)} names make targets that do not " \
                                    f"exist: {sorted(commands - targets)}"


def write_docs() -> list[Path]:
    """Rewrites each generated block in its doc; returns the docs rewritten."""
    bodies = {"kinds": kinds.markdown_table(), "metrics": metrics_table()}
    for name, doc in GENERATED.items():
        text = doc.read_text()
        block(text, name)  # the markers must be there
        text = re.sub(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)",
                      lambda m, body=bodies[name]: f"{m.group(1)}{body}\n{m.group(2)}", text,
                      flags=re.DOTALL)
        doc.write_text(text)
    return sorted(set(GENERATED.values()))


if __name__ == "__main__":
    written = write_docs()
    print("rewrote the generated blocks of "
          + ", ".join(str(d.relative_to(ROOT)) for d in written), file=sys.stderr)
