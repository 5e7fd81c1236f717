"""Every symbol and file the README and docs name in backticks exists: a dotted name of depthscope's
(``analysis.causal.views``, ``depthscope.probes.capture``, ``post_ln.find_layout`` for a module
named alone) resolves by import and attribute, and a repository path (``probes/adapters/fit.py``,
``docs/design.md``) is a file, from the root or from ``depthscope/``. Placeholders in capitals
(``schemes/NAME.py``) and globs are patterns, not names. Commands and their options are checked by
``test_docs_commands.py``.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "depthscope"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FILE = re.compile(r"\.(py|md|json|nc|js|html|toml|safetensors|png|svg)$")
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


def module_of(first: str) -> str | None:
    """The depthscope module a name's first part names: a subpackage or module of the package, or a
    module file named so exactly once anywhere in it; None where it is not depthscope's."""
    if first == "depthscope":
        return "depthscope"
    if (PACKAGE / first / "__init__.py").exists() or (PACKAGE / f"{first}.py").exists():
        return f"depthscope.{first}"
    found = list(PACKAGE.rglob(f"{first}.py"))
    if len(found) != 1:
        return None
    return ".".join(found[0].relative_to(ROOT).with_suffix("").parts)


def resolves(name: str) -> bool | None:
    """Whether a dotted name of depthscope's resolves (None: not a name of depthscope's). A name the
    package's code holds as a string (an entry-point group, ``depthscope.families``) resolves too."""
    if any(f'"{name}"' in p.read_text() for p in PACKAGE.rglob("*.py")):
        return True
    first, *rest = name.split(".")
    mod = module_of(first)
    if mod is None:
        return None
    obj = importlib.import_module(mod)
    for part in rest:
        try:
            obj = importlib.import_module(f"{mod}.{part}")
            mod = f"{mod}.{part}"
            continue
        except ModuleNotFoundError:
            pass
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def named(doc: Path) -> list[str]:
    """The backticked tokens of a doc, call parentheses dropped, placeholders and globs left out."""
    out = []
    for token in sorted(set(re.findall(r"`([^`\s]+)`", doc.read_text()))):
        t = token.split("(")[0].rstrip(".,:;")
        if not t or re.search(r"[*{}<>\[\]]|(?<![A-Za-z])[A-Z]{3,}(?![a-z])", t):
            continue
        out.append(t)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_name_and_file_in_the_docs_exists(doc):
    missing = []
    checked = 0
    for t in named(doc):
        if "/" in t and FILE.search(t) and not t.startswith(("http", "/", "~", ".")):
            checked += 1
            if not ((ROOT / t).exists() or (PACKAGE / t).exists()):
                missing.append(t)
        elif DOTTED.fullmatch(t) and not FILE.search(t):
            found = resolves(t)
            checked += found is not None
            if found is False:
                missing.append(t)
    assert not missing, f"{doc.name} names what does not exist: {missing}"
    assert checked or doc.name not in ("README.md", "reference.md", "design.md")


def test_the_check_sees_a_missing_name_and_a_missing_file(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "`analysis.causal.views` `analysis.causal.nothing` `probes/adapters/none.py` `a.b` `NAME.py`"
    )
    assert named(doc) == [
        "a.b",
        "analysis.causal.nothing",
        "analysis.causal.views",
        "probes/adapters/none.py",
    ]
    assert resolves("analysis.causal.views") and resolves("analysis.causal.nothing") is False
    assert resolves("a.b") is None
