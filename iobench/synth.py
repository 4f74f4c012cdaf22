"""Synthetic samples, each a pure function of (seed, global sample index).

Token samples come a block of ``TOKEN_BLOCK`` at a time (one call per block instead of one
per sample); sample i is row ``i % TOKEN_BLOCK`` of block ``i // TOKEN_BLOCK``, so any
process can produce any sample without the others.  Images
are real JPEGs (Pillow): a smooth colour field plus grain, with dimensions and grain
chosen so that sizes spread like ImageNet's (mean ~110-130 KB at quality 90).
"""

from __future__ import annotations

import functools
import io
from dataclasses import dataclass

import numpy as np

from iobench.formats.base import Sample

TOKEN_BLOCK = 256
POOL_TOKENS = 1 << 23
SYNTH_VERSION = 2
_TOKENS_STREAM = 0x746F6B   # separates the token and image random streams of one seed
_IMAGES_STREAM = 0x696D67
_ZIPF_TABLE_BITS = 22


def token_dtype_for(vocab_size: int, requested: str = "auto") -> np.dtype:
    if requested == "auto":
        return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)
    return np.dtype(requested)


@dataclass(frozen=True)
class TokenParams:
    seq_len: int
    vocab_size: int
    dtype: str            # uint16 | uint32
    distribution: str     # uniform | zipf
    zipf_a: float = 1.1


class TokenSynth:
    """Token samples cut from one seeded pool of ``POOL_TOKENS`` ids per dataset.

    Drawing every id from the RNG cost ~2 CPU-s per GiB, which on a busy machine made token
    synthesis, not the storage, the bottleneck.  Each sample is instead a window of the pool
    at an offset drawn from (seed, block): a copy per sample, no per-id arithmetic.  Ids keep the
    requested distribution; windows repeat only at pool distance (16-32 MB apart), beyond the
    match window of zstd below its ultra levels.  (fio, by default, writes one buffer over and
    over.)  One block of ``TOKEN_BLOCK`` samples stays cached, so sequential access is cheap.
    """

    def __init__(self, seed: int, p: TokenParams) -> None:
        self.seed = seed
        self.p = p
        self.dtype = np.dtype(p.dtype)
        self._block_id = -1
        self._block: np.ndarray | None = None
        self._windows: np.ndarray | None = None

    def windows(self) -> np.ndarray:
        """(pool length - seq_len + 1, seq_len) read-only view: row k is the window at offset k."""
        if self._windows is None:
            pool = _token_pool(self.seed, self.p.vocab_size, self.p.distribution, self.p.zipf_a, self.dtype.str,
                               max(POOL_TOKENS, 8 * self.p.seq_len))
            self._windows = np.lib.stride_tricks.sliding_window_view(pool, self.p.seq_len)
        return self._windows

    def block(self, b: int) -> np.ndarray:
        if b != self._block_id:
            win = self.windows()
            bits = np.random.SFC64(np.random.SeedSequence([self.seed, _TOKENS_STREAM, b]))
            offsets = bits.random_raw(TOKEN_BLOCK) % np.uint64(win.shape[0])
            self._block = win[offsets]     # fancy indexing copies: the block owns its memory
            self._block_id = b
        return self._block

    def rows(self, start: int, stop: int) -> np.ndarray:
        """Samples start..stop-1 as a 2-D view; the range must lie within one block."""
        b = start // TOKEN_BLOCK
        assert (stop - 1) // TOKEN_BLOCK == b
        return self.block(b)[start - b * TOKEN_BLOCK: stop - b * TOKEN_BLOCK]

    def tokens(self, i: int) -> np.ndarray:
        return self.block(i // TOKEN_BLOCK)[i % TOKEN_BLOCK]

    def sample(self, i: int) -> Sample:
        return Sample(index=i, data=self.tokens(i))

    def nominal_bytes(self) -> int:
        return self.p.seq_len * self.dtype.itemsize


@functools.lru_cache(maxsize=2)
def _token_pool(seed: int, vocab: int, distribution: str, a: float, dtype: str, n: int) -> np.ndarray:
    """n ids drawn from the distribution, a pure function of the arguments."""
    dt = np.dtype(dtype)
    bits = np.random.SFC64(np.random.SeedSequence([seed, _TOKENS_STREAM, 2**62]))
    pool = np.empty(n, dtype=dt)
    table = _zipf_table(vocab, a, dt) if distribution == "zipf" else None
    chunk = 1 << 20
    for i in range(0, n, chunk):
        m = min(chunk, n - i)
        words = bits.random_raw((m + 1) // 2).view(np.uint32)[:m]
        if table is not None:
            # Inverse-CDF lookup quantised to 2**-22: exact Zipf weights down to that resolution.
            pool[i:i + m] = table[words >> np.uint32(32 - _ZIPF_TABLE_BITS)]
        else:
            # floor(word * vocab / 2**32): bias at most 1 in 2**32 / vocab.
            pool[i:i + m] = (words.astype(np.uint64) * np.uint64(vocab)) >> np.uint64(32)
    pool.flags.writeable = False
    return pool


@functools.lru_cache(maxsize=4)
def _zipf_table(vocab: int, a: float, dtype: np.dtype) -> np.ndarray:
    """2**22 slots; token k fills a share of them equal to its Zipf probability (rounded)."""
    slots = 1 << _ZIPF_TABLE_BITS
    w = 1.0 / np.arange(1, vocab + 1, dtype=np.float64) ** a
    edges = np.rint(np.cumsum(w) / w.sum() * slots).astype(np.int64)
    edges[-1] = slots
    counts = np.diff(edges, prepend=0)
    table = np.repeat(np.arange(vocab, dtype=dtype), counts)
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class ImageParams:
    width: int = 500
    height: int = 375
    size_jitter: float = 0.2      # log-normal spread of the scale (ImageNet's sizes vary widely)
    grain: int = 48               # amplitude of per-pixel noise; drives the JPEG size
    quality: int = 90
    num_classes: int = 1000


class ImageSynth:
    """JPEG samples cut from one seeded texture per dataset (a smooth colour field plus grain):
    each image is a crop of random size at a random, not 8-pixel aligned, offset, possibly
    mirrored.  Rendering every image from scratch cost 2-3x the JPEG encoding itself; JPEG sizes
    depend on the texture's detail, which the grain sets, not on the pixels being unique."""

    def __init__(self, seed: int, p: ImageParams) -> None:
        self.seed = seed
        self.p = p
        self._texture = None

    def texture(self):
        from .extras import require  # the install hint when Pillow is missing

        require("PIL.Image", "images")
        from PIL import Image, ImageChops

        if self._texture is None:
            p = self.p
            rng = np.random.default_rng([self.seed, _IMAGES_STREAM, 2**62])
            w, h = 2 * p.width + 97, 2 * p.height + 89
            coarse = rng.integers(0, 256, size=(max(2, h // 24), max(2, w // 24), 3), dtype=np.uint8)
            tex = Image.fromarray(coarse).resize((w, h), Image.BILINEAR)
            if p.grain > 0:
                noise = Image.fromarray(rng.integers(0, 2 * p.grain + 1, size=(h, w, 3), dtype=np.uint8))
                tex = ImageChops.add(tex, noise, 1.0, -p.grain)
            self._texture = tex
        return self._texture

    def render(self, i: int):
        """(PIL RGB image, label) of sample ``i``."""
        from PIL import Image

        p = self.p
        rng = np.random.default_rng([self.seed, _IMAGES_STREAM, i])
        scale = float(np.exp(rng.normal(0.0, p.size_jitter))) if p.size_jitter > 0 else 1.0
        aspect = float(np.exp(rng.normal(0.0, p.size_jitter / 2))) if p.size_jitter > 0 else 1.0
        w = int(min(max(16, round(p.width * scale * aspect)), 2 * p.width))
        h = int(min(max(16, round(p.height * scale)), 2 * p.height))
        label = int(rng.integers(0, p.num_classes))
        tex = self.texture()
        ox = int(rng.integers(0, tex.width - w + 1))
        oy = int(rng.integers(0, tex.height - h + 1))
        img = tex.crop((ox, oy, ox + w, oy + h))
        flip = int(rng.integers(0, 4))
        if flip:
            img = img.transpose((Image.FLIP_LEFT_RIGHT, Image.FLIP_TOP_BOTTOM, Image.ROTATE_180)[flip - 1])
        return img, label

    def pixels(self, i: int) -> tuple[np.ndarray, int]:
        img, label = self.render(i)
        return np.asarray(img), label

    def encode(self, image) -> bytes:
        from PIL import Image

        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=self.p.quality)
        return buf.getvalue()

    def sample(self, i: int) -> Sample:
        img, label = self.render(i)
        return Sample(index=i, data=self.encode(img), label=label)

    def nominal_bytes(self, probes: int = 8) -> int:
        """Mean JPEG size of a few probe images (deterministic for the seed), to plan shard sizes."""
        sizes = [len(self.sample(i).data) for i in range(probes)]
        return int(np.mean(sizes))


_RECORDS_STREAM = 0x726563
_RECORD_POOL_BYTES = 1 << 24


@dataclass(frozen=True)
class RecordParams:
    mean_bytes: int                # MLPerf Storage / DLIO ``record_length_bytes``
    stdev_bytes: int = 0           # ``record_length_bytes_stdev`` (sizes ~ normal, clipped to >= 1)
    num_classes: int = 1000


class RecordSynth:
    """Opaque byte records of normally distributed size, like DLIO's synthetic samples.

    Sample i's size is drawn from (seed, i) alone; its bytes are a window of one seeded pool
    of random (incompressible) bytes at an offset drawn from (seed, i), repeated when the
    record is longer than the pool (16 MiB: beyond zstd's match window below its ultra levels).
    """

    def __init__(self, seed: int, p: RecordParams) -> None:
        self.seed = seed
        self.p = p
        self._pool: np.ndarray | None = None

    def pool(self) -> np.ndarray:
        if self._pool is None:
            bits = np.random.SFC64(np.random.SeedSequence([self.seed, _RECORDS_STREAM, 2**62]))
            self._pool = bits.random_raw(_RECORD_POOL_BYTES // 8).view(np.uint8)
        return self._pool

    def size_and_label(self, i: int) -> tuple[int, int]:
        rng = np.random.default_rng([self.seed, _RECORDS_STREAM, i])
        size = self.p.mean_bytes
        if self.p.stdev_bytes > 0:
            size = int(round(rng.normal(self.p.mean_bytes, self.p.stdev_bytes)))
        return max(1, size), int(rng.integers(0, self.p.num_classes))

    def record(self, i: int) -> tuple[np.ndarray, int]:
        size, label = self.size_and_label(i)
        pool = self.pool()
        start = int(np.random.default_rng([self.seed, _RECORDS_STREAM, i, 1]).integers(0, pool.size))
        if start + size <= pool.size:
            return pool[start:start + size], label
        out = np.empty(size, dtype=np.uint8)
        pos, off = 0, start
        while pos < size:
            n = min(size - pos, pool.size - off)
            out[pos:pos + n] = pool[off:off + n]
            pos, off = pos + n, 0
        return out, label

    def sample(self, i: int) -> Sample:
        data, label = self.record(i)
        return Sample(index=i, data=data.tobytes(), label=label)

    def nominal_bytes(self) -> int:
        return self.p.mean_bytes
