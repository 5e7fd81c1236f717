"""The README's Python quickstart runs as written (with fewer tokens)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_readme_quickstart_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    code = blocks[0].replace("n_tokens=8192", "n_tokens=256")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    assert (tmp_path / "attnres.png").stat().st_size > 1000
    assert (
        len(
            [
                line
                for line in blocks[0].splitlines()
                if line.strip() and not line.startswith(("import", "from"))
            ]
        )
        <= 5
    )


def test_readme_documents_the_two_commands():
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    assert text.index("make demo") < text.index("## What it is")
