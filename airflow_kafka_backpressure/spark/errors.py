"""The batch job's error type (its own module: the job's steps all raise it)."""

from __future__ import annotations


class JobError(RuntimeError):
    """The batch cannot be run as specified; the message says what and what to do."""
