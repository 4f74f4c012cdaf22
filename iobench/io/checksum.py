"""Checksums in one place: the ``"<algo>:<hex>"`` strings manifests carry, and the hashers
that produce them.

Every writer and verifier (generate, verify, tier copies, lifecycle archive copies,
checkpoint rank files, GDS delivery checks) asks this module, so a checksum written by one
is checked by another with the same algorithm and the same hex spelling.

- ``new_hasher(algo_or_checksum)``: an object with ``update`` and ``hexdigest`` for
  ``xxh64`` (datasets' default), ``xxh3_64`` (checkpoints), ``xxh128``, ``xxh32``,
  ``crc32c`` (8 hex digits), ``sha256``/``sha1``/``md5``.  Accepts a bare name or a whole
  manifest checksum (``"xxh64:1f2e..."``), whose algorithm it takes.
- ``checksum_of(data, algo)``: ``"<algo>:<hex>"`` of a buffer.
- ``ChecksumWriter(f, algo)``: a write-only file wrapper that counts and hashes every
  byte on its way to ``f`` (shard writers write through it).
- ``matches(checksum, hexdigest)``: compares a manifest checksum with a digest.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

#: Algorithms a dataset generator may be asked for (``gen --checksum``).
DATASET_ALGOS = ("xxh64", "crc32c")
_XXH = ("xxh64", "xxh3_64", "xxh3", "xxh128", "xxh3_128", "xxh32")
#: Every algorithm a manifest may name ("none": indexed without checksums, sizes and counts only).
KNOWN_ALGOS = _XXH + ("crc32c", "sha256", "md5", "sha1", "none")


class _Crc32c:
    """crc32c with hashlib's ``update``/``hexdigest`` shape (8 lowercase hex digits)."""

    def __init__(self) -> None:
        import crc32c

        self._fn = crc32c.crc32c
        self.value = 0

    def update(self, data) -> None:
        self.value = self._fn(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def algo_of(checksum: str) -> str:
    """The algorithm named by ``"<algo>:<hex>"`` or by a bare ``"<algo>"``."""
    return checksum.partition(":")[0].lower()


def new_hasher(checksum: str) -> Any:
    """A hasher (``update``/``hexdigest``) for an algorithm name or a manifest checksum."""
    algo = algo_of(checksum)
    if algo in _XXH:
        import xxhash

        return {"xxh64": xxhash.xxh64, "xxh32": xxhash.xxh32, "xxh3_64": xxhash.xxh3_64, "xxh3": xxhash.xxh3_64,
                "xxh128": xxhash.xxh3_128, "xxh3_128": xxhash.xxh3_128}[algo]()
    if algo == "crc32c":
        return _Crc32c()
    if algo in ("sha256", "md5", "sha1"):
        import hashlib

        return hashlib.new(algo)
    raise ConfigError("manifest.checksum", f"unknown checksum algorithm {algo!r}",
                      "use xxh64, xxh3_64, xxh128, crc32c or sha256")


def checksum_of(data, algo: str) -> str:
    """``data``'s checksum as ``"<algo>:<hex>"`` (``algo`` may itself be a checksum to match)."""
    name = algo_of(algo)
    if name == "xxh3_64":  # the one-shot form skips the hasher object (checkpoint rank files)
        import xxhash

        return "xxh3_64:" + xxhash.xxh3_64_hexdigest(data)
    h = new_hasher(name)
    h.update(data)
    return f"{name}:{h.hexdigest()}"


def matches(checksum: str, hexdigest: str) -> bool:
    return checksum.partition(":")[2].lower() == hexdigest.lower()


class ChecksumWriter:
    """Wraps an output file: counts and checksums every byte on its way to it."""

    def __init__(self, f, algo: str) -> None:
        self.f = f
        self.algo = algo_of(algo)
        self.count = 0
        self._h = new_hasher(self.algo)

    def write(self, b) -> int:
        self.f.write(b)
        n = len(b) if not isinstance(b, memoryview) else b.nbytes
        self._h.update(b)
        self.count += n
        return n

    def update(self, b) -> None:
        """Hash without writing (a hasher that also counts)."""
        self._h.update(b)
        self.count += len(b) if not isinstance(b, memoryview) else b.nbytes

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        self.f.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return False

    @property
    def closed(self) -> bool:
        return False

    def close(self) -> None:  # whoever opened the real file publishes and closes it
        pass

    def hexdigest(self) -> str:
        return self._h.hexdigest()

    def digest(self) -> str:
        """``"<algo>:<hex>"``, as manifests store it."""
        return f"{self.algo}:{self._h.hexdigest()}"


class _Null:
    def write(self, b):
        return len(b)

    def flush(self):
        pass


def new_tally(algo: str) -> ChecksumWriter:
    """A counting checksum accumulator that writes nowhere (``update``/``write``, then ``digest()``)."""
    return ChecksumWriter(_Null(), algo)
