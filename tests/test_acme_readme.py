"""The README's Acme and TF-Agents sections are the code `tests/test_acme_real.py` and
`tests/test_tf_agents.py` run.

The block under "With Acme" must equal, dedented, the lines between `# [README: Acme]` and
`# [/README]` in `examples/acme_sync_loop.py`, and the block under "With TF-Agents" those of
`# [README: TF-Agents]` in `examples/tf_agents_dqn.py`: edit the example, then copy it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "acme_sync_loop.py"
TF_AGENTS = ROOT / "examples" / "tf_agents_dqn.py"


def example_block(example: Path = EXAMPLE, name: str = "Acme") -> str:
    text = example.read_text()
    found = re.search(rf"^[ \t]*# \[README: {name}\]\n(.*?)^[ \t]*# \[/README\]$", text,
                      re.MULTILINE | re.DOTALL)
    assert found, f"{example.name} has no '# [README: {name}]' ... '# [/README]' block"
    return textwrap.dedent(found.group(1))


def readme_block(heading: str = "With Acme") -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index(heading):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, f"README: no python block after {heading!r}"
    return found.group(1)


def test_the_readmes_acme_block_is_the_example_the_acme_test_runs() -> None:
    assert readme_block() == example_block()


def test_the_readmes_tf_agents_block_is_the_example_the_tf_agents_test_runs() -> None:
    block = example_block(TF_AGENTS, "TF-Agents")
    assert readme_block("With TF-Agents") == block
    assert "probe.wrap_client(replay.py_client)" in block and 'gate="schedule"' in block


def test_the_example_block_wraps_the_builder_with_a_started_probe() -> None:
    block = example_block()
    assert "probe.start()" in block and "probe.wrap_builder(builder)" in block
