"""The one exception type for user mistakes (the CLI prints its message and exits 2), and how another
library's failure is told in one line of it (``first_line``).
"""

from __future__ import annotations

import re

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colour codes some libraries put in messages


def first_line(err: BaseException, limit: int = 160) -> str:
    """An exception's first line, without colour codes and at most ``limit`` characters: how another
    library's failure is told inside one line of a refusal.
    """
    return (ANSI.sub("", str(err)).splitlines() or [""])[0][:limit]


class DepthscopeError(Exception):
    """A user mistake (bad file, unknown scheme, too-short corpus ...), described in one line."""


class CheckpointError(DepthscopeError):
    """A checkpoint file that cannot be loaded; the message names the file and the problem."""


class CorpusError(DepthscopeError):
    """A corpus that is missing, unreadable, empty or too short."""


class ConfigError(DepthscopeError):
    """An unknown scheme, option or invalid setting."""


class TraceError(DepthscopeError):
    """A trace file that is missing, corrupt or of another format version."""
