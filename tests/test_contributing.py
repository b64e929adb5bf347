"""CONTRIBUTING.md's recipes stay true: every code name they quote exists, and the commands
they show are the Makefile's.

A recipe that names a function the code no longer has sends the next contributor looking
for it; these fail when a rename leaves the recipe behind.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "CONTRIBUTING.md"
# Names a recipe asks the contributor to choose, not names of the code.
PLACEHOLDERS = {"YOUR_KIND", "is_your_kind", "X", "your_kind"}
SEARCHED = ("replaywatch", "agents", "harness", "tests", "bench", "tools", "deploy",
            "dashboards", "examples")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?")


def quoted_names(text: str) -> set[str]:
    """Code names quoted in backticks: identifiers, dotted names and calls `f()`; paths,
    commands and expressions are other tests' business."""
    out = set()
    for quoted in re.findall(r"`([^`\n]+)`", text):
        if IDENTIFIER.fullmatch(quoted):
            out.update(p for p in quoted.removesuffix("()").split(".") if p not in PLACEHOLDERS)
    return out


def corpus() -> str:
    files = [p for folder in SEARCHED for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in {".py", ".libsonnet", ".jsonnet", ".yml", ".yaml",
                                             ".json", ".toml"}]
    return "\n".join(p.read_text(errors="replace") for p in [*files, ROOT / "Makefile"])


def test_every_code_name_the_recipes_quote_exists() -> None:
    text, code = DOC.read_text(), corpus()
    names = quoted_names(text)
    assert {"BY_KIND", "RULES", "Shape", "families", "trainer_rows"} <= names
    missing = sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", code))
    assert missing == [], f"CONTRIBUTING.md quotes names the code does not have: {missing}"


def test_the_lint_line_is_the_makefiles() -> None:
    shown = re.search(r"^make lint\s+# ruff check ([a-z ]+?) \(", DOC.read_text(), re.M)
    recipe = re.search(r"^lint:.*\n\t.*ruff check ([a-z ]+)$", (ROOT / "Makefile").read_text(),
                       re.M)
    assert shown and recipe
    assert shown.group(1).split() == recipe.group(1).split()


def test_the_name_check_finds_a_stale_name() -> None:
    assert quoted_names("call `_gauge(name)` or `_sources`, see `a/b.py`") == {"_sources"}
    assert quoted_names("`rules.BY_KIND` and `families()`") == {"rules", "BY_KIND", "families"}


def test_comments_say_why_not_which_issue() -> None:
    cites = re.compile(r"\bissues? \d+|\bissue's\b", re.I)
    found = [f"{p.relative_to(ROOT)}:{n}" for folder in SEARCHED
             for p in sorted((ROOT / folder).rglob("*.py"))
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if cites.search(line) and "github.com" not in line]
    assert found == []


def test_architecture_names_every_module() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    modules = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "replaywatch").rglob("*.py")
                     if p.name != "__init__.py")
    assert [m for m in modules if m not in text] == []


def test_the_findings_keeper_keeps_memory_and_io_only() -> None:
    source = (ROOT / "replaywatch" / "findings.py").read_text()
    assert len(source.splitlines()) < 140
    assert "rules_" not in source and "reconcile(" not in source and "diagnose(" not in source
    # One function judges a cycle: nothing else reconciles and sorts a diagnosis.
    callers = [p.relative_to(ROOT).as_posix() for p in (ROOT / "replaywatch").rglob("*.py")
               if "reconcile(" in p.read_text() and p.name not in ("lifecycle.py", "cycle.py")]
    assert callers == []


def test_a_kind_is_in_every_file_the_recipe_names() -> None:
    from replaywatch.diagnosis import kinds
    from replaywatch.model import Severity

    text = DOC.read_text()
    listed = text[text.index("<!-- kind-files:begin -->"):text.index("<!-- kind-files:end -->")]
    named = set(re.findall(r"`([A-Za-z_./<>-]+\.(?:py|md|yml|yaml|libsonnet))`", listed))
    assert named >= {"replaywatch/model.py", "replaywatch/diagnosis/kinds.py",
                     "replaywatch/diagnosis/rules_<family>.py", "tests/test_bundle_kinds.py",
                     "docs/runbooks/<kind>.md", "docs/findings.md",
                     "dashboards/mixin/kinds.libsonnet", "dashboards/prometheus/alerts.yml",
                     "dashboards/prometheus/alerts_test.yml",
                     "deploy/kubernetes/base/prometheusrule.yaml"}, named
    rule_modules = [p.read_text() for p in (ROOT / "replaywatch" / "diagnosis").glob("rules_*.py")]
    tests = [p.read_text() for p in (ROOT / "tests").glob("test_*.py")
             if p.name != "test_bundle_kinds.py"]
    for k in kinds.ALL:
        name, const = str(k.name), k.name.name
        every = {
            "replaywatch/model.py": f'{const} = "{name}"',
            "replaywatch/diagnosis/kinds.py": f"Name.{const}",
            "tests/test_bundle_kinds.py": f'"{name}"',
            f"docs/runbooks/{name}.md": f"# {name} (",
            "docs/findings.md": f"`{name}`",
        }
        if k.severity >= Severity.WARNING:
            every["dashboards/prometheus/alerts_test.yml"] = f"kind: {name}"
        if k.severity is Severity.CRITICAL:
            every.update({f: name for f in (
                "dashboards/mixin/kinds.libsonnet", "dashboards/prometheus/alerts.yml",
                "deploy/kubernetes/base/prometheusrule.yaml")})
        for path, needle in every.items():
            assert needle in (ROOT / path).read_text(), (name, path)
        assert any(f"kinds.{const}" in m for m in rule_modules), (name, "its rule")
        assert any(name in t for t in tests), (name, "a test case")
