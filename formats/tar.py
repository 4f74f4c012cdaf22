"""`tar`: WebDataset shards (POSIX ustar), readable in one sequential pass.

Members are grouped by ``__key__`` (the member name up to the first dot of its basename):
images as ``KEY.jpg`` + ``KEY.cls`` (the label in ASCII), tokens as ``KEY.npy``.  Headers
are fixed (mtime 0, uid/gid 0, mode 0644) so a seed gives byte-identical shards.  A tar
whose members are neither images nor tokens reads as opaque records: a sample's bytes are
its members' payloads in stored order (a ``cls`` member, if numeric, is its label).  The
manifest's per-sample offsets (where each sample's first member starts, its extended headers
included: ``iter_entries``) allow random access without a side index.  ``zstd`` compresses the whole shard as one stream.
"""

from __future__ import annotations

import io
import tarfile
from typing import Iterator, NamedTuple

import numpy as np

from iobench.errors import IntegrityError

from .base import FormatSpec, Reader, Sample, ShardLayout, Writer
from .compression import decompress, is_zstd, parse_compression

BLOCK = 512
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "img")
LABEL_EXTS = ("cls", "cls2", "label", "class", "target")
TOKEN_EXTS = ("npy", "tokens.npy", "tokens", "input_ids.npy")


def _header(name: str, size: int) -> bytes:
    ti = tarfile.TarInfo(name)
    ti.size = size
    ti.mode = 0o644
    ti.mtime = 0
    ti.uname = ti.gname = ""
    return ti.tobuf(format=tarfile.USTAR_FORMAT)


def npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


# Parsed .npy headers by their bytes: a shard's samples mostly share one dtype and shape, and numpy's
# own header parser (ast.literal_eval) costs more than the rest of a sample's parse together.
_NPY_HEADERS: dict[bytes, tuple[np.dtype, tuple, bool, int, int]] = {}


def _npy_header(head: bytes) -> tuple[np.dtype, tuple, bool, int, int]:
    """(dtype, shape, fortran, element count, payload offset) of a .npy header, as numpy reads it."""
    got = _NPY_HEADERS.get(head)
    if got is None:
        buf = io.BytesIO(head)
        version = np.lib.format.read_magic(buf)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read(buf)
        count = 1
        for d in shape:
            count *= d
        got = (dtype, shape, fortran, count, buf.tell())
        if len(_NPY_HEADERS) >= 1024:
            _NPY_HEADERS.clear()
        _NPY_HEADERS[head] = got
    return got


def npy_array(data) -> np.ndarray:
    """Parse .npy bytes without copying the payload."""
    mv = memoryview(data)
    major = mv[6]
    hlen = int.from_bytes(mv[8:10], "little") + 10 if major == 1 else int.from_bytes(mv[8:12], "little") + 12
    dtype, shape, fortran, count, offset = _npy_header(mv[:hlen].tobytes())
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if len(shape) == 1:
        return arr
    return arr.reshape(shape, order="F" if fortran else "C")


class TarWriter(Writer):
    def __init__(self, f, **kw) -> None:
        super().__init__(f, **kw)
        self._comp = parse_compression(self.compression)
        self._out = self._comp.stream_writer(f) if self._comp.enabled else f
        self._pos = 0
        self._offsets: list[int] = []
        self._npy_header: tuple | None = None

    def _member(self, name: str, payload) -> None:
        n = len(payload)
        pad = -n % BLOCK
        self._out.write(_header(name, n))
        self._out.write(payload)
        if pad:
            self._out.write(b"\0" * pad)
        self._pos += BLOCK + n + pad

    def _npy(self, arr: np.ndarray) -> bytes:
        arr = np.ascontiguousarray(arr, dtype=np.dtype(self.token_dtype).newbyteorder("<"))
        key = (arr.shape, arr.dtype.str)
        if self._npy_header is None or self._npy_header[0] != key:
            full = npy_bytes(arr)
            self._npy_header = (key, full[: len(full) - arr.nbytes])
        return self._npy_header[1] + arr.tobytes()

    def write(self, sample: Sample) -> None:
        key = f"{sample.index:09d}"
        self._offsets.append(self._pos)
        if self.modality == "tokens":
            self._member(key + ".npy", self._npy(np.asarray(sample.data)))
        else:
            self._member(key + ".jpg", sample.data)
            self._member(key + ".cls", str(int(sample.label if sample.label is not None else -1)).encode())

    def finish(self) -> ShardLayout:
        self._out.write(b"\0" * (2 * BLOCK))
        end = self._pos
        if self._comp.enabled:
            self._out.close()
            return ShardLayout(samples=len(self._offsets))
        return ShardLayout(samples=len(self._offsets), offsets=tuple(self._offsets) + (end,))


_ZERO_BLOCK = bytes(BLOCK)
_REGULAR = (b"0", b"\0", b"7")                 # tarfile.REGTYPE, AREGTYPE, CONTTYPE
_SKIP = (b"5", b"g")                            # DIRTYPE, XGLTYPE
_PAX = (b"x", b"X")                             # XHDTYPE, SOLARIS_XHDTYPE
_EXTENDED = _PAX + (b"L", b"K")                 # headers that describe the member after them
# The numeric fields tarfile.TarInfo.frombuf parses besides size and checksum (mode, uid, gid,
# mtime, devmajor, devminor): the slim parser checks them too, so that it accepts no header
# tarfile would reject.
_NUM_FIELDS = ((100, 108), (108, 116), (116, 124), (136, 148), (329, 337), (337, 345))


def _octal(field: bytes) -> int | None:
    """tarfile.nti for an octal field; None where tarfile must decide (base-256, bad digits)."""
    if field[0] in (0o200, 0o377):
        return None
    p = field.find(b"\0")
    if p >= 0:
        field = field[:p]
    try:
        return int(field.strip() or b"0", 8)
    except ValueError:
        return None


def _slim_rest(buf: bytes) -> tuple[int, bytes, str] | None:
    """What a header says outside its name, size and checksum fields: (their byte sum, typeflag,
    ustar prefix), or None wherever the slim path is not sure (base-256 or malformed number fields,
    old GNU sparse members)."""
    typ = buf[156:157]
    if typ == b"S":
        return None
    for a, b in _NUM_FIELDS:
        if _octal(buf[a:b]) is None:
            return None
    prefix = ""
    if buf[345]:
        p = buf.find(b"\0", 345, 500)
        prefix = buf[345:p if p >= 0 else 500].decode("utf-8", "surrogateescape")
    return sum(buf[100:124]) + sum(buf[136:148]) + sum(buf[156:]), typ, prefix


# Headers' other parts already parsed, by their bytes (a process-wide, bounded cache): a shard's
# members mostly share mode, owner, times and type and differ only in name, size and checksum, so
# only those three are read per member.  A stream worker parses one sample's range at a time, so a
# per-call cache would never hit.
_HEADER_RESTS: dict[bytes, tuple[int, bytes, str] | None] = {}


def _slim_header(buf: bytes) -> tuple[str, int, bytes] | None:
    """(name, size, typeflag) of a ustar/GNU/pax header block, as tarfile.TarInfo.frombuf reads
    them, or None wherever the slim path is not sure (bad checksum, base-256 or malformed number
    fields, old GNU sparse members): the caller then asks tarfile, which decides or raises."""
    chksum = _octal(buf[148:156])
    size = _octal(buf[124:136])
    if chksum is None or size is None:
        return None
    key = buf[100:124] + buf[136:148] + buf[156:]
    try:
        rest = _HEADER_RESTS[key]
    except KeyError:
        rest = _slim_rest(buf)
        if len(_HEADER_RESTS) >= 256:
            _HEADER_RESTS.clear()
        _HEADER_RESTS[key] = rest
    if rest is None:
        return None
    rest_sum, typ, prefix = rest
    # the unsigned byte sum of the block with the checksum field as spaces (trailing NULs add nothing)
    if chksum != 256 + rest_sum + sum(buf[124:136]) + sum(buf[:100].rstrip(b"\0")):
        return None                                 # tarfile also accepts the signed-char sum
    p = buf.find(b"\0", 0, 100)
    name = buf[:p if p >= 0 else 100].decode("utf-8", "surrogateescape")
    if typ == b"\0" and name.endswith("/"):
        typ = b"5"                                  # old V7 tar: a directory as a file with a slash
    if typ == b"5":
        name = name.rstrip("/")
    if prefix and typ not in (b"L", b"K", b"S"):    # tarfile.GNU_TYPES
        name = prefix + "/" + name
    return name, size, typ


def _header_fields(buf: bytes, pos: int, where: str) -> tuple[str, int, bytes]:
    fast = _slim_header(buf)
    if fast is not None:
        return fast
    try:
        ti = tarfile.TarInfo.frombuf(buf, "utf-8", "surrogateescape")
    except tarfile.HeaderError as e:
        raise IntegrityError(f"{where}: offset {pos}: bad tar header ({e})") from None
    return ti.name, ti.size, ti.type


class TarEntry(NamedTuple):
    """One regular file of a tar, with the byte range it occupies.

    ``start`` is where the member's first header block is: its first pax (``x``) or GNU
    long-name/long-link (``L``/``K``) extended header where it has one, else its own ustar
    header -- ``tarfile.TarInfo.offset``.  ``end`` is the end of its data padded to 512 bytes.
    A sample's range is its first member's ``start`` to the next sample's ``start``: cut at the
    member's own header instead, a range loses the long name or pax records of its first member
    and carries the next sample's extended headers at its tail."""

    name: str
    start: int
    end: int
    payload: memoryview


def iter_entries(data, where: str = "shard") -> Iterator[TarEntry]:
    """Each regular file of ``data`` as a ``TarEntry``, handling GNU long names and pax headers:
    the one source of tar member names and byte ranges (the index's sample offsets and every
    reader's parse).

    Headers go through ``_slim_header`` (name incl. the ustar prefix, size, typeflag, checksum
    and every numeric field checked as tarfile does) and fall back to ``tarfile.TarInfo.frombuf``
    for anything unusual (GNU base-256 numbers, signed-char checksums, sparse members) and for the
    error message.  Payloads are memoryview slices of ``data``, never copied."""
    mv = memoryview(data)
    pos, n = 0, len(mv)
    long_name: str | None = None
    pax_path: str | None = None
    pax_size: int | None = None
    ext_at: int | None = None                       # the first extended header of the member to come
    while pos + BLOCK <= n:
        hdr = mv[pos:pos + BLOCK].tobytes()
        if hdr == _ZERO_BLOCK:
            return
        name, size, typ = _header_fields(hdr, pos, where)
        if pax_size is not None and typ not in _EXTENDED and typ != b"g":
            size = pax_size                         # pax "size" overrides the header's field
        start = pos + BLOCK
        end = start + size
        if size < 0 or end > n:
            raise IntegrityError(f"{where}: offset {pos}: member {name!r} runs past the end of the shard")
        payload = mv[start:end]
        header_at = pos
        pos = end + (-size % BLOCK)
        if typ in _EXTENDED and ext_at is None:
            ext_at = header_at
        if typ == b"L":                             # tarfile.GNUTYPE_LONGNAME
            long_name = payload.tobytes().rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if typ == b"K":                             # tarfile.GNUTYPE_LONGLINK: a link's target, not read
            continue
        if typ in _PAX:
            try:
                path, psize = _pax_records(payload.tobytes())
            except ValueError:
                raise IntegrityError(f"{where}: offset {header_at}: bad tar header (invalid pax header)") from None
            pax_path = path or pax_path
            pax_size = psize if psize is not None else pax_size
            continue
        if typ in _SKIP:
            if typ == b"5":                         # a directory uses up the long name / pax records
                long_name = pax_path = pax_size = ext_at = None
            continue
        name = pax_path or long_name or name
        first = header_at if ext_at is None else ext_at
        long_name = pax_path = pax_size = ext_at = None
        if typ in _REGULAR:
            yield TarEntry(name, first, pos, payload)


def _pax_records(raw: bytes) -> tuple[str | None, int | None]:
    """The ``path`` and ``size`` records of a pax extended header (later records win, as in tarfile)."""
    path = size = None
    pos = 0
    while pos < len(raw):
        sp = raw.find(b" ", pos)
        if sp < 0:
            break
        length = int(raw[pos:sp])
        if length <= 0:
            break
        key, _, value = raw[sp + 1:pos + length - 1].partition(b"=")
        if key == b"path":
            path = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            size = int(value)
        pos += length
    return path, size


def split_key(name: str) -> tuple[str, str]:
    """WebDataset's rule: key = path up to the first dot of the basename; the rest is the extension."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1:].lower()


class TarReader(Reader):
    def iter_samples(self, data, shard) -> Iterator[Sample]:
        if is_zstd(data):
            data = decompress(data)
        for j, fields in enumerate(self.iter_groups(data, shard.path)):
            yield self._sample(shard.first_sample + j, fields, shard.path)

    def iter_groups(self, data, where: str = "shard") -> Iterator[dict[str, memoryview]]:
        key, fields = None, {}
        for name, _start, _end, payload in iter_entries(data, where):
            k, ext = split_key(name)
            if key is not None and k != key:
                yield fields
                fields = {}
            key = k
            fields[ext] = payload
        if fields:
            yield fields

    def _sample(self, index: int, fields: dict, where: str) -> Sample:
        if self.manifest.modality == "tokens":
            for ext in TOKEN_EXTS:
                if ext in fields:
                    raw = fields[ext]
                    if ext.endswith("npy"):
                        return Sample(index=index, data=npy_array(raw))
                    return Sample(index=index, data=np.frombuffer(raw, dtype=self.manifest.spec.get("token_dtype",
                                                                                                    "uint16")))
            raise IntegrityError(f"{where}: sample {index}: no token member (have {sorted(fields)})")
        if self.manifest.modality == "records":
            return self._record(index, fields)
        image = label = None
        for e in IMAGE_EXTS:          # loops, not next(genexpr): this runs once per sample
            if e in fields:
                image = fields[e]
                break
        if image is None:
            raise IntegrityError(f"{where}: sample {index}: no image member (have {sorted(fields)})")
        for e in LABEL_EXTS:
            if e in fields:
                label = fields[e]
                break
        return Sample(index=index, data=bytes(image), label=int(bytes(label).strip()) if label is not None else None)

    @staticmethod
    def _record(index: int, fields: dict) -> Sample:
        """An opaque record: its members' payloads in stored order (a label member, if any, apart)."""
        label = None
        parts = []
        for ext, payload in fields.items():
            if ext in LABEL_EXTS and label is None:
                try:
                    label = int(bytes(payload).strip())
                    continue
                except ValueError:
                    pass
            parts.append(payload)
        data = bytes(parts[0]) if len(parts) == 1 else b"".join(parts)
        return Sample(index=index, data=data, label=label)

    def sample_from_range(self, shard, i, record) -> Sample:
        # iter_groups' grouping, inlined: a stream or map read parses one sample's range per call
        key, fields = None, {}
        for name, _start, _end, payload in iter_entries(record, shard.path):
            k, ext = split_key(name)
            if key is not None and k != key:
                fields = {}
                break
            key = k
            fields[ext] = payload
        if not fields:
            groups = list(self.iter_groups(record, shard.path))
            raise IntegrityError(f"{shard.path}: sample {i}: range holds {len(groups)} samples, expected 1")
        return self._sample(shard.first_sample + i, fields, shard.path)


FORMAT = FormatSpec(name="tar", extension=".tar", writer=TarWriter, reader=TarReader, indexable=True)
