"""`files`: one file per sample — the small-file baseline the domain models warn about.

Every "shard" holds exactly one sample, so a dataset of N samples is N files and N
manifest entries: each read costs an open (a metadata operation) for one sample's bytes.
Generate it with ``--shard-size "1 samples"``.

Image sample: the JPEG itself, with the label in a JPEG comment segment (``FF FE``) right
after the start-of-image marker, so the file stays a valid image; the reader strips it
and returns the original JPEG bytes.  An indexed ImageFolder layout (``CLASS/NAME.jpg``,
two or more class folders) takes labels from the folders, as torchvision's ``ImageFolder``
does: the folder's index among the sorted class names (the manifest's ``spec.classes``).  Token sample: the little-endian token array (the
whole file one zstd frame with ``zstd``).
"""

from __future__ import annotations

import posixpath
import struct
from typing import Iterator

import numpy as np

from iobench.errors import ConfigError, IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer
from .compression import decompress, parse_compression

_SOI = b"\xff\xd8"
_COM = b"\xff\xfe"
_LABEL_TAG = b"iobench-label="


def _with_label(jpeg: bytes, label: int | None) -> bytes:
    if label is None or bytes(jpeg[:2]) != _SOI:
        return bytes(jpeg)
    payload = _LABEL_TAG + str(int(label)).encode()
    return _SOI + _COM + struct.pack(">H", len(payload) + 2) + payload + bytes(jpeg[2:])


def _split_label(data: bytes | memoryview) -> tuple[bytes, int | None]:
    mv = memoryview(data)
    if bytes(mv[:2]) == _SOI and bytes(mv[2:4]) == _COM:
        (n,) = struct.unpack(">H", mv[4:6])
        payload = bytes(mv[6:4 + n])
        if payload.startswith(_LABEL_TAG):
            return _SOI + bytes(mv[4 + n:]), int(payload[len(_LABEL_TAG):])
    return bytes(mv), None


class FilesWriter(Writer):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        if self.num_samples is not None and self.num_samples != 1:
            raise ConfigError("gen.shard_size", f"the files format stores one sample per file, not {self.num_samples}",
                              "use --shard-size '1 samples'")
        self._comp = parse_compression(self.compression)
        self._count = 0

    def write(self, sample: Sample) -> None:
        if self._count:
            raise ConfigError("gen.shard_size", "the files format stores one sample per file",
                              "use --shard-size '1 samples'")
        if self.modality == "tokens":
            payload = np.ascontiguousarray(sample.data, dtype=np.dtype(self.token_dtype).newbyteorder("<")).tobytes()
        else:
            payload = _with_label(sample.data, sample.label)
        self.f.write(self._comp.compress(payload) if self._comp.enabled else payload)
        self._count += 1

    def finish(self) -> ShardLayout:
        return ShardLayout(samples=self._count)


class FilesReader(Reader):
    def __init__(self, manifest) -> None:
        super().__init__(manifest)
        # an indexed ImageFolder layout (class_name/xxx.jpg): label = the folder's index in sorted order
        self._classes = {c: i for i, c in enumerate((manifest.spec or {}).get("classes") or ())}

    def iter_samples(self, data, shard) -> Iterator[Sample]:
        if shard.samples != 1:
            raise IntegrityError(f"{shard.path}: the files format holds one sample per file, manifest says "
                                 f"{shard.samples}")
        yield self.decode(data, shard)

    def decode(self, data, shard) -> Sample:
        body = decompress(data) if self.manifest.compression != "none" else data
        if self.manifest.modality == "tokens":
            spec = self.manifest.spec
            dtype = np.dtype(spec.get("resolved_token_dtype", spec.get("token_dtype", "uint16"))).newbyteorder("<")
            if len(body) % dtype.itemsize:
                raise IntegrityError(f"{shard.path}: offset {len(body)}: truncated token array")
            return Sample(index=shard.first_sample, data=np.frombuffer(body, dtype=dtype))
        jpeg, label = _split_label(body)
        if label is None and self._classes:
            label = self._classes.get(posixpath.dirname(shard.path))
        return Sample(index=shard.first_sample, data=jpeg, label=label)

    def sample_range(self, shard, i):
        if i != 0 or self.manifest.compression != "none":
            return None
        return 0, shard.bytes

    def sample_from_range(self, shard, i, record) -> Sample:
        return self.decode(record, shard)


FORMAT = FormatSpec(name="files", extension=".sample", writer=FilesWriter, reader=FilesReader, indexable=False,
                    compression_scope=(("tokens", "sample"), ("images", "sample")))
