"""The one exception type for user mistakes: the CLI prints its message and exits 2."""

from __future__ import annotations


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
