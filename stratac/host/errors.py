"""The errors a host call raises after the compiler has accepted a schedule.

A StrataError (stratac.diagnostics) is about the program; these are about one call: what the user
passed (StrataUsageError) and what happened on the machine (StrataRuntimeError). Both host targets
raise them.
"""

from __future__ import annotations


class StrataRuntimeError(RuntimeError):
    """A launch failed: a rule of the machine was broken, a wait timed out, a peer died."""


class StrataUsageError(ValueError):
    """A call was made with arguments the schedule cannot take (named in the message)."""
