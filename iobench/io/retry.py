"""The one retry policy: exponential back-off, bounded by attempts and by a time budget.

Every retried I/O in iobench goes through ``RetryPolicy``: the loader's object-store GETs
(transient errors only, with jitter) and tier copies (any failure, a checksum mismatch
counted as a re-fetch).  The S3 client's own retries are switched off
(``S3_CLIENT_RETRIES`` in ``iobench.storage``), so the attempts a user asks for are the
attempts made, and each one passes through the backend wrappers and is counted there
instead of hiding inside one measured latency.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from ..errors import ConfigError, IntegrityError, StorageError

T = TypeVar("T")

_NOT_RETRIED = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
_CLIENT_MODULES = ("botocore", "aiohttp", "aiobotocore", "urllib3")


def transient(e: BaseException) -> bool:
    """Worth another try on a read path: I/O and network errors, not a missing file."""
    if isinstance(e, _NOT_RETRIED):
        return False
    if isinstance(e, (OSError, TimeoutError, ConnectionError)):
        return True
    # botocore/aiohttp errors that s3fs did not translate
    return type(e).__module__.split(".")[0] in _CLIENT_MODULES


def any_failure(e: BaseException) -> bool:
    """Worth another try on a copy: anything but bad input (the source may come back)."""
    return not isinstance(e, (ConfigError, KeyboardInterrupt))


@dataclass(frozen=True)
class Outcome:
    value: object
    attempts: int          # tries made, the successful one included
    refetches: int         # tries repeated because the bytes failed their checksum


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential back-off (optionally jittered), bounded by attempts and by a time budget."""

    attempts: int = 5            # tries per request, the first included
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0
    budget_s: float = 30.0       # total time one request may spend retrying
    jitter: bool = True          # spread retries of many workers (0.5-1.0 x the delay)

    def delay_s(self, attempt: int, rng: random.Random | None) -> float:
        """Back-off after failed try ``attempt`` (0-based)."""
        d = min(self.max_delay_s, self.base_delay_s * 2 ** attempt)
        if self.jitter and rng is not None:
            d *= 0.5 + rng.random() / 2
        return d

    def run(self, fn: Callable[[], T], describe: Callable[[], str], *, rng: random.Random | None = None,
            retry_if: Callable[[BaseException], bool] = transient,
            on_retry: Callable[[int, BaseException], None] | None = None) -> Outcome:
        """Call ``fn`` until it succeeds; raise one ``StorageError`` naming ``describe()`` when it never does."""
        t0 = time.perf_counter()
        last: BaseException | None = None
        refetches = 0
        tries = max(1, self.attempts)
        attempt = 0
        for attempt in range(tries):
            try:
                return Outcome(fn(), attempt + 1, refetches)
            except Exception as e:
                if not retry_if(e):
                    raise
                last = e
                if isinstance(e, IntegrityError):
                    refetches += 1
            if on_retry is not None:
                on_retry(attempt + 1, last)
            elapsed = time.perf_counter() - t0
            delay = self.delay_s(attempt, rng)
            if attempt + 1 >= tries or elapsed + delay > self.budget_s:
                break
            time.sleep(delay)
        elapsed = time.perf_counter() - t0
        kind = "failed its checksum" if isinstance(last, IntegrityError) else "failed"
        raise StorageError(f"{describe()}: {kind} after {attempt + 1} attempts: {type(last).__name__}: {last} "
                           f"(gave up after {elapsed:.1f} s)") from last

    def call(self, fn: Callable[[], T], describe: Callable[[], str], rng: random.Random | None = None) -> T:
        """``fn()``, retried on transient errors; its value."""
        return self.run(fn, describe, rng=rng).value  # type: ignore[return-value]
