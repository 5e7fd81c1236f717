"""The planted bugs of ``make mutants`` (tests/mutants.py) still plant: each one's code occurs
exactly once in its file and each test it names exists, so a change to the code cannot leave a
mutant that no longer applies (it would stop ``make mutants`` with an error, long after the change)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.mutants import MUTANTS

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_every_mutant_plants_once_and_names_tests_that_exist(mutant):
    text = (ROOT / mutant.path).read_text()
    assert text.count(mutant.old) == 1, (
        f"{mutant.path}: the mutant's code occurs {text.count(mutant.old)} times"
    )
    assert mutant.new != mutant.old
    for test in mutant.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file(), path
        if name:
            assert f"def {name.split('[')[0]}(" in (ROOT / path).read_text(), test
