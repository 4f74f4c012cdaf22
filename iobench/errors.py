"""One error hierarchy for iobench.

Each class also subclasses the matching built-in, so callers that catch
``ValueError`` or ``OSError`` keep working.  The CLI maps ``UsageError`` (bad input:
config, flags, URLs, missing optional packages, unreachable endpoints) to exit code 2
with one line, and every other ``IobenchError`` to exit code 1.
"""

from __future__ import annotations


class IobenchError(Exception):
    """Base class of every error iobench raises on purpose."""

    exit_code = 1


class UsageError(IobenchError, ValueError):
    """Bad input from the user; the message names the field and the fix."""

    exit_code = 2

    def __init__(self, field: str, problem: str, fix: str | None = None):
        self.field = field
        self.problem = problem
        self.fix = fix
        msg = f"{field}: {problem}" if field else problem
        if fix:
            msg += f" ({fix})"
        super().__init__(msg)


class ConfigError(UsageError):
    """A configuration key or value is invalid."""


class MissingDependencyError(UsageError, ImportError):
    """An optional package is needed for the requested feature."""

    def __init__(self, feature: str, package: str, extra: str | None = None):
        hint = f"pip install 'iobench[{extra}]'" if extra else f"pip install {package}"
        super().__init__(feature, f"needs the optional package '{package}'", f"install it: {hint}")


class EndpointError(UsageError, ConnectionError):
    """A storage endpoint cannot be reached or refused our credentials."""


class StorageError(IobenchError, OSError):
    """An I/O operation failed after the retries that were right for it."""


class IntegrityError(IobenchError):
    """Data does not match its manifest (size, checksum, sample count)."""


class NoCheckpointError(IobenchError):
    """No committed checkpoint exists where one was asked for."""
