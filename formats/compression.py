"""Compression settings: ``none`` or ``zstd:LEVEL`` (zstandard), parsed once and shared by the formats.

Where it applies differs by format and is recorded in the manifest as the compression
*scope*: ``sample`` (each record compressed on its own, the byte index stays valid),
``shard`` (the whole shard is one zstd stream; read it in one pass) or ``page`` (Parquet
compresses its own column pages).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO

from iobench.errors import ConfigError

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True, slots=True)
class Compression:
    kind: str = "none"     # none | zstd
    level: int = 0

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def __str__(self) -> str:
        return "none" if not self.enabled else f"{self.kind}:{self.level}"

    def compress(self, data: bytes) -> bytes:
        if not self.enabled:
            return bytes(data)
        import zstandard

        return zstandard.ZstdCompressor(level=self.level).compress(data)

    def stream_writer(self, f: IO[bytes]):
        """A writer that compresses into ``f`` and leaves ``f`` open when closed."""
        import zstandard

        return zstandard.ZstdCompressor(level=self.level).stream_writer(f, closefd=False)


def parse_compression(value: str | None, field: str = "compression") -> Compression:
    """'none' | 'zstd' | 'zstd:LEVEL' (LEVEL 1..22; 3 when omitted)."""
    text = str(value if value is not None else "none").strip().lower()
    if text in ("", "none", "off", "false"):
        return Compression()
    kind, _, level = text.partition(":")
    if kind != "zstd":
        raise ConfigError(field, f"unknown compression {value!r}", "use none or zstd:LEVEL, e.g. zstd:3")
    try:
        lvl = int(level) if level else 3
    except ValueError:
        raise ConfigError(field, f"level in {value!r} is not a number", "use zstd:LEVEL with LEVEL 1..22") from None
    if not 1 <= lvl <= 22:
        raise ConfigError(field, f"zstd level {lvl} is out of range", "use a level from 1 to 22")
    return Compression("zstd", lvl)


def decompress(data: bytes | memoryview) -> bytes:
    """Decompress one zstd frame (or several concatenated ones)."""
    import zstandard

    import io

    # Frames written by a stream writer carry no content size, so one-shot decompress() refuses them.
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as r:
        return r.read()


def is_zstd(data: bytes | memoryview) -> bool:
    return bytes(data[:4]) == ZSTD_MAGIC
