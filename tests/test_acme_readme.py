"""The Acme and TF-Agents recipes (docs/attach.md, and README's Acme block) are the code
`tests/test_acme_real.py` and `tests/test_tf_agents.py` run.

The block under "With Acme" (docs/attach.md's heading, README.md's bold line) must equal,
dedented, the lines between `# [README: Acme]` and `# [/README]` in
`examples/acme_sync_loop.py`, and the block under "With TF-Agents" in docs/attach.md those of
`# [README: TF-Agents]` in `examples/tf_agents_dqn.py`: edit the example, then copy it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "acme_sync_loop.py"
TF_AGENTS = ROOT / "examples" / "tf_agents_dqn.py"
ATTACH = ROOT / "docs" / "attach.md"
README = ROOT / "README.md"


def example_block(example: Path = EXAMPLE, name: str = "Acme") -> str:
    text = example.read_text()
    found = re.search(rf"^[ \t]*# \[README: {name}\]\n(.*?)^[ \t]*# \[/README\]$", text,
                      re.MULTILINE | re.DOTALL)
    assert found, f"{example.name} has no '# [README: {name}]' ... '# [/README]' block"
    return textwrap.dedent(found.group(1))


def doc_block(heading: str = "## With Acme", doc: Path = ATTACH) -> str:
    """The first python block after the first `heading` in `doc`."""
    text = doc.read_text()
    assert heading in text, f"{doc.name}: no {heading!r}"
    section = text[text.index(heading):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, f"{doc.name}: no python block after {heading!r}"
    return found.group(1)


def test_the_docs_acme_block_is_the_example_the_acme_test_runs() -> None:
    assert doc_block() == example_block()
    assert doc_block("**With Acme**", README) == example_block()


def test_the_docs_tf_agents_block_is_the_example_the_tf_agents_test_runs() -> None:
    block = example_block(TF_AGENTS, "TF-Agents")
    assert doc_block("## With TF-Agents") == block
    assert "probe.wrap_client(replay.py_client)" in block and 'gate="schedule"' in block


def test_the_example_block_wraps_the_builder_with_a_started_probe() -> None:
    block = example_block()
    assert "probe.start()" in block and "probe.wrap_builder(builder)" in block
