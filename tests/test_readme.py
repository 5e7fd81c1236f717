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


def test_every_option_in_the_readme_exists():
    """Each `depthscope ...` line of the README's shell examples names a command and options it has."""
    import typer

    from depthscope.cli import app

    root = typer.main.get_command(app)
    seen = 0
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S):
        for line in block.splitlines():
            line = line.split("#")[0]
            if "depthscope " not in line or line.lstrip().startswith("make"):
                continue
            words = line[line.index("depthscope ") + len("depthscope ") :].split()
            command = root.commands[words[0]]
            if hasattr(command, "commands") and len(words) > 1 and words[1] in command.commands:
                command = command.commands[words[1]]  # a group's subcommand (zoo list, rank sweep)
            elif hasattr(command, "commands"):  # `rank CKPT`: the group's default command
                command = command.commands["measure"]
            names = {opt for p in command.params for opt in (*p.opts, *p.secondary_opts)}
            for option in (w.split("=")[0] for w in words if w.startswith("--")):
                assert option in names, f"{option} is not an option of `depthscope {' '.join(words[:2])}`"
            seen += 1
    assert seen >= 15


def test_readme_is_a_guide():
    """The README stays short and has the two how-to sections as headed sections."""
    text = README.read_text()
    assert len(text.splitlines()) <= 170
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert "Adding a scheme" in headings and "Reading your own model" in headings


def test_every_relative_link_in_the_readme_exists():
    """Each relative link or image of the README names a file or directory of the repository."""
    targets = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    relative = [t.split("#")[0] for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]
    assert relative, "the README links nothing"
    missing = [t for t in relative if not (README.parent / t).exists()]
    assert not missing, f"README links to missing files: {missing}"


def test_the_readme_spec_reads_a_nanogpt():
    """The README's ModelSpec, as written, reads a nanoGPT written from scratch, in under 10 lines."""
    import torch

    import depthscope
    from tests.probes.adapters.spec_models import CTX, VOCAB, seeded

    block = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)[1]
    assert "ModelSpec" in block and len(block.strip().splitlines()) <= 10
    tokens = torch.randint(0, VOCAB, (2, CTX), generator=torch.Generator().manual_seed(0))
    space = {"depthscope": depthscope, "model": seeded("nanogpt"), "data": tokens}
    exec(compile(block.replace("spec=spec)", "spec=spec, ctx=16, n_tokens=32)"), "README.md", "exec"), space)
    trace = space["trace"]
    assert float(trace["residual_error"].max()) < 1e-5
    assert list(trace.source.values[:3]) == ["embed", "embed.wpe", "0.attn"]
