"""The README's Acme section is the code `tests/test_acme_real.py` runs.

The block under "With Acme" must equal, dedented, the lines between `# [README: Acme]` and
`# [/README]` in `examples/acme_sync_loop.py`: edit the example, then copy it.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "acme_sync_loop.py"


def example_block() -> str:
    text = EXAMPLE.read_text()
    found = re.search(r"^[ \t]*# \[README: Acme\]\n(.*?)^[ \t]*# \[/README\]$", text,
                      re.MULTILINE | re.DOTALL)
    assert found, f"{EXAMPLE.name} has no '# [README: Acme]' ... '# [/README]' block"
    return textwrap.dedent(found.group(1))


def readme_acme_block() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("With Acme"):]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "README: no python block after 'With Acme'"
    return found.group(1)


def test_the_readmes_acme_block_is_the_example_the_acme_test_runs() -> None:
    assert readme_acme_block() == example_block()


def test_the_example_block_wraps_the_builder_with_a_started_probe() -> None:
    block = example_block()
    assert "probe.start()" in block and "probe.wrap_builder(builder)" in block
