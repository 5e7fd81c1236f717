"""Every research-shaped model (research.py) is read EXACTLY or REFUSED in one line: never a wrong
number, never a traceback."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.adversarial.harness import check, judge
from tests.adversarial.research import CASES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_exact_or_refused(case):
    check(case, judge(case))


def test_the_suite():
    """Names are unique ids, every refusal says what it must match, and both outcomes are tested."""
    names = Counter(c.name for c in CASES)
    assert not [n for n, k in names.items() if k > 1], "case names must be unique"
    assert all(c.match for c in CASES if c.expect == "refused"), "a refused case without a pattern"
    assert {c.expect for c in CASES} == {"exact", "refused"}
    assert len(CASES) >= 32
