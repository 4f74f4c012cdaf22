"""What a loader worker tells the consumer besides batches: typed, frozen messages.

A worker sends ``Ready`` once its storage and format reader are open, then batches, then
exactly one of ``Done`` (its counters) or ``Failed`` (the error, wrapped).  Batch metadata
travels as the plain tuples ``("batch", meta)`` / ``("batches", [meta, ...])`` of
``receiver.Sender``: it is the per-batch hot path, and a tuple of a dict pickles and unpickles
fastest.

``ExceptionWrapper`` carries a worker's exception across the pipe with the worker's own
traceback (as PyTorch's ``torch.utils.data._utils.worker`` does): an error that does not
pickle travels as a ``RuntimeError`` naming its type, and ``reraise`` chains the worker's
traceback text as the cause, so a debugger or ``--debug`` shows where in the worker it rose.
"""

from __future__ import annotations

import pickle
import traceback
from dataclasses import dataclass

from ..errors import IobenchError, StorageError


@dataclass(frozen=True)
class Ready:
    worker: int


@dataclass(frozen=True)
class Done:
    worker: int
    stats: dict


class RemoteTraceback(Exception):
    """The text of a worker's traceback, as the cause of the error re-raised in the consumer."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class ExceptionWrapper:
    error: BaseException
    traceback: str

    @classmethod
    def of(cls, e: BaseException) -> ExceptionWrapper:
        """Wrap ``e`` (being handled) with the current traceback; a copy that survives pickling."""
        tb = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:  # noqa: BLE001 — any failure to pickle: send its type and text instead
            e = RuntimeError(f"{type(e).__name__}: {e}")
        return cls(e, tb)

    def reraise(self, worker: int) -> None:
        """Raise the worker's error here: iobench's own errors as they are (their exit codes and
        one-line messages hold), anything else as a StorageError naming the worker."""
        err = self.error
        err.__cause__ = RemoteTraceback(f"\nworker {worker}:\n{self.traceback}")
        if isinstance(err, IobenchError):
            raise err
        raise StorageError(f"loader worker {worker} failed: {type(err).__name__}: {err}") from err


@dataclass(frozen=True)
class Failed:
    worker: int
    error: ExceptionWrapper
