"""Errors a user can act on. Each carries one line saying what is wrong and how to fix it.

The CLI prints ``error: <message>`` and exits with :attr:`StreamproofError.exit_code`; no traceback
is shown for any of these (DESIGN: exit 2 = bad input, 1 = loss or duplicates found).
"""

from __future__ import annotations


class StreamproofError(Exception):
    """Base of the errors the CLI turns into one line and an exit code."""

    exit_code = 2


class ConfigError(StreamproofError):
    """The pipeline file or a command-line argument is invalid."""


class SetupError(StreamproofError):
    """Something the machine needs (java, mvn, jars, postgres) is missing or broken."""


class InfraError(StreamproofError):
    """The local Kafka broker or PostgreSQL server could not be started, reached or stopped."""


class PipelineError(StreamproofError):
    """A pipeline failed for a reason the user can act on (e.g. the topic does not exist)."""
