"""Storage backends: an fsspec filesystem plus a root URL, with capability flags.

``open_backend("s3://bucket/prefix", endpoint_url=...)`` returns a ``Backend`` whose
paths are relative to the root.  Benchmarks must not be fooled by caches, so every
filesystem is created with fsspec's instance cache and listings cache off.  Writes go
through ``Backend.open_output``, which never leaves a partial object under the final name:
local files are written to a temp name, fsynced and renamed (then the directory is
fsynced); S3 objects appear only when the upload completes and are aborted on error.

Credentials come from ``storage_options``, the standard ``AWS_*`` environment variables or
the AWS config files; they are never logged (``Backend.describe`` omits them).
"""

from __future__ import annotations

import io
import ipaddress
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import IO, Any, Iterator
from urllib.parse import urlparse

import fsspec
from fsspec.registry import known_implementations, registry

from .config import nearest
from .errors import ConfigError, EndpointError, MissingDependencyError
from .io.atomic import atomic_open
from .io.inputs import loads_yaml, open_regular, pread_full, require_regular
from .paths import check_inside
from .results import redact_text

# Protocols without directories: prefixes appear with their objects.
_KINDS = {"file": "local", "memory": "memory"}
_NO_DIRS = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "adl", "http", "https", "hf", "oss")
# Clients for S3 reads: "s3fs" (fsspec's, always there with the s3 extra), "obstore" (Rust
# object_store client, the s3fast extra; ~2x s3fs per GET here, see reports/reference/load.md),
# "auto" (obstore when installed).  Everything but reads goes through s3fs either way.
S3_CLIENTS = ("auto", "s3fs", "obstore")


def url_protocol(url: str) -> str:
    """The fsspec protocol of ``url`` ('file' for a plain path, a Windows drive letter included)."""
    protocol = urlparse(str(url)).scheme or "file"
    return "file" if len(protocol) == 1 else protocol


def storage_kind(url: str) -> str:
    """What kind of storage ``url`` names: 'local' (POSIX files), 'memory' (this process),
    'object' (object semantics: no directories, objects appear whole; s3, gs, az, ...) or
    'other' (http, hf, sftp, ...).  The loader picks its shard source by this."""
    return _kind(url_protocol(url))


def _kind(protocol: str) -> str:
    """The storage kind of a protocol (the table the factories pick their classes by)."""
    return _KINDS.get(protocol) or ("object" if protocol in _NO_DIRS and protocol not in ("http", "https", "hf") else "other")


@dataclass
class Backend:
    """Storage at a root URL through an fsspec filesystem: any protocol fsspec knows (gs, az, hf,
    http(s), sftp, ...), and the base of one class per storage kind (``LocalBackend``,
    ``MemoryBackend``, ``S3Backend``), which ``open_backend`` picks.

    Capability flags: callers read these instead of branching on the protocol.  Each storage
    kind's class sets its own, and only its class knows what it can do; a new kind is a subclass
    that sets its flags and overrides the requests it serves better."""

    url: str
    protocol: str
    root: str
    fs: Any = field(repr=False)
    endpoint_url: str | None = None
    reader: Any = field(default=None, repr=False)   # a faster client for ranged GETs (ObstoreReader), or None

    is_local = False                  # files on a local (POSIX) file system: paths, fds, page cache, fsync
    # the S3 API through s3fs (conditional create with If-None-Match, S3 probes, endpoint URL)
    speaks_s3 = False
    supports_bulk_transfer = False    # one call moves many files concurrently (s3fs put/rm lists, multipart)
    shared_between_processes = True   # other processes see the same data (false for memory://)
    supports_odirect = False          # reads with O_DIRECT (no page cache)

    @property
    def kind(self) -> str:
        """'local', 'memory', 'object' or 'other' (``storage_kind``)."""
        return _kind(self.protocol)

    @property
    def is_object_store(self) -> bool:
        """Object semantics: no directories, objects appear whole on completion (s3, gs, az, ...)."""
        return self.kind == "object"

    @property
    def server_on_this_host(self) -> bool:
        """An object store served from this machine (a loopback endpoint, e.g. the embedded
        server): it competes with the loader's processes for the same cores."""
        if not self.is_object_store or not self.endpoint_url:
            return False
        host = urlparse(self.endpoint_url).hostname or ""
        if host == "localhost":
            return True
        try:
            return ipaddress.ip_address(host).is_loopback
        except ValueError:
            return False

    @property
    def parallel_ranged_reads(self) -> bool:
        """Ranged reads of one object, in parallel, beat one whole read (object stores)."""
        return self.is_object_store

    @property
    def zero_copy_reads(self) -> bool:
        """A whole ranged read comes back in the client's own buffer with no copy (obstore's
        Bytes), so parsing it where it landed is cheapest; elsewhere (s3fs joins a body's
        chunks into a fresh ``bytes``) ``cat_into`` a reused buffer is."""
        return self.reader is not None

    @property
    def has_directories(self) -> bool:
        return self.protocol not in _NO_DIRS

    @property
    def read_client(self) -> str:
        """Which client serves reads: 'obstore', 's3fs', or the protocol's fsspec filesystem."""
        return self.protocol

    @property
    def base(self) -> "Backend":
        """The innermost real backend (wrappers override; a plain backend is its own)."""
        return self

    def path(self, rel: str = "") -> str:
        """Full path (as the filesystem names it) of ``rel`` under the root; never outside it.

        A leading '/' is taken as relative to the root; a '..' component is refused (exit 2),
        so no caller — whatever manifest, catalog or config its path came from — can join its
        way out of the root.  (Symlinks are checked where the file system is consulted:
        ``iobench.paths.check_inside``, e.g. when a manifest is read or a tier file deleted.)"""
        rel = rel.lstrip("/")
        if ".." in rel and ".." in rel.replace("\\", "/").split("/"):
            raise ConfigError("path", f"{rel!r} has a '..' component: it would leave {self.url}",
                              "paths must stay inside their root")
        if not rel:
            return self.root
        return f"{self.root.rstrip('/')}/{rel}" if self.root else rel

    def local_path(self, rel: str = "") -> str:
        raise ConfigError("url", f"{self.url} is not a local path", "give a local directory")

    def child(self, rel: str) -> "Backend":
        """A backend rooted at ``rel`` below this one, sharing the filesystem object."""
        return replace(self, url=self.url.rstrip("/") + "/" + rel.strip("/"), root=self.path(rel))

    def connect(self) -> None:
        """Open clients and sessions now, before a measured clock starts (no-op where nothing to open)."""

    def check_reachable(self, field_name: str = "url") -> None:
        """Fail fast, with exit code 2, when the storage cannot be reached (each storage kind checks its own way)."""
        try:
            self.fs.info(self.root)
        except FileNotFoundError:
            raise EndpointError(field_name, f"nothing at {self.url}", "check the URL") from None
        except PermissionError:
            raise EndpointError(field_name, f"access to {self.url} was denied",
                                "check the credentials in the environment or profile (never put them in flags)") from None
        except Exception as e:  # noqa: BLE001 - connection refused, DNS, timeouts, auth libraries' own errors
            raise EndpointError(field_name, f"cannot reach {self.url} ({type(e).__name__})",
                                "check the URL and that the server is running") from e

    def relative(self, full: str) -> str | None:
        """``full`` (as the filesystem lists it) relative to the root; None when it is outside."""
        root = self.root.rstrip("/")
        if not str(full).startswith(root + "/"):
            return None
        return str(full)[len(root) + 1:]

    def describe(self) -> dict:
        return {"url": redact_text(self.url), "protocol": self.protocol,
                "endpoint_url": redact_text(self.endpoint_url) if self.endpoint_url else None,
                "read_client": self.read_client}

    # Thin helpers over fsspec, relative to the root.
    def exists(self, rel: str) -> bool:
        return self.fs.exists(self.path(rel))

    def size(self, rel: str) -> int:
        return int(self.fs.size(self.path(rel)))

    def cat(self, rel: str, start: int | None = None, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of ``rel`` as ``bytes`` (a copy out of a fast client's own buffer;
        fsspec's ``bytes`` pass unchanged)."""
        return bytes(self.cat_buffer(rel, start, end))

    def cat_buffer(self, rel: str, start: int | None, end: int | None):
        """Bytes ``[start, end)`` of ``rel`` as a read-only buffer (len(), memoryview()), not
        necessarily ``bytes``: a fast client's own buffer is handed over without a copy (a whole
        shard read in one GET is parsed where it landed)."""
        return self.fs.cat_file(self.path(rel), start=start, end=end)

    def cat_into(self, rel: str, start: int, end: int, out) -> int:
        """Bytes ``[start, end)`` of ``rel`` into the writable buffer ``out``; returns the count.

        Reads land in the caller's buffer (a loader's reused shard buffer) with one copy at
        most (local files ``preadv`` straight into it, a fast client copies once out of its own
        buffer).  A short count means the object ended early.
        """
        out = memoryview(out).cast("B")[:end - start]
        data = self.cat_buffer(rel, start, end)
        n = min(len(data), len(out))
        out[:n] = memoryview(data)[:n]
        return n

    def open(self, rel: str, mode: str = "rb", **kw) -> IO:
        return self.fs.open(self.path(rel), mode, **kw)

    def cat_stream(self, rel: str, start: int, end: int, first: bool = True) -> bytes:
        """Bytes ``start:end`` as the next piece of a sequential stream over ``rel`` (a loader's
        streaming reader).  Real backends serve it as a ranged read; the emulation wrapper
        charges its per-request latency only on the stream's ``first`` piece."""
        return self.cat(rel, start, end)

    def ls(self, rel: str = "", detail: bool = False) -> list:
        try:
            return self.fs.ls(self.path(rel), detail=detail)
        except FileNotFoundError:
            return []

    def rm(self, rel: str, recursive: bool = False) -> None:
        self.fs.rm(self.path(rel), recursive=recursive)

    def makedirs(self, rel: str = "") -> None:
        if self.has_directories:  # S3 has none; prefixes appear with their objects
            self.fs.makedirs(self.path(rel), exist_ok=True)

    @contextmanager
    def open_output(self, rel: str, fsync: bool = True) -> Iterator[IO]:
        """A writable file that becomes visible under ``rel`` only when the block succeeds."""
        f = self.fs.open(self.path(rel), "wb")
        try:
            yield f
        except BaseException:
            # Abort the upload so that no object appears under the final name.
            discard = getattr(f, "discard", None)
            if discard is not None:
                discard()
            if isinstance(f, fsspec.spec.AbstractBufferedFile):
                f.closed = True  # its close() would otherwise commit what was written
            raise
        f.close()

    def write_bytes(self, rel: str, data: bytes, fsync: bool = True) -> None:
        with self.open_output(rel, fsync=fsync) as f:
            f.write(data)


class LocalBackend(Backend):
    """Files on a local (POSIX) file system: reads open regular files only (fsspec's ``open``
    of a FIFO blocks forever), writes are atomic (temp name, fsync, rename, fsync of the
    directory), and nothing is written or deleted through a symlinked directory out of the root."""

    is_local = True
    supports_odirect = hasattr(os, "O_DIRECT")

    def local_path(self, rel: str = "") -> str:
        return self.path(rel)

    def check_reachable(self, field_name: str = "url") -> None:
        """Nothing to reach: a local directory needs no server (and a writer creates it)."""

    def cat_buffer(self, rel: str, start: int | None, end: int | None):
        require_regular(self.path(rel), "path", _NOT_A_FILE_FIX)   # fsspec's open of a FIFO blocks forever
        return super().cat_buffer(rel, start, end)

    def cat_into(self, rel: str, start: int, end: int, out) -> int:
        out = memoryview(out).cast("B")[:end - start]
        fd = open_regular(self.path(rel), "path", _NOT_A_FILE_FIX)   # a FIFO would block forever
        try:
            return pread_full(fd, out, start)
        finally:
            os.close(fd)

    def open(self, rel: str, mode: str = "rb", **kw) -> IO:
        if "r" in mode:
            require_regular(self.path(rel), "path", _NOT_A_FILE_FIX)
        return super().open(rel, mode, **kw)

    def rm(self, rel: str, recursive: bool = False) -> None:
        full, rel = self.path(rel), rel.strip("/")   # path() refuses a '..' first
        if rel:
            # Never delete through a symlinked directory that leads out of the root.
            check_inside(self.root, rel.rpartition("/")[0], "path")
            if recursive:
                check_inside(self.root, rel, "path")
        self.fs.rm(full, recursive=recursive)

    @contextmanager
    def open_output(self, rel: str, fsync: bool = True) -> Iterator[IO]:
        check_inside(self.root, rel.strip("/").rpartition("/")[0], "path")   # no symlinked dir out of the root
        with atomic_open(self.path(rel), "wb", fsync=fsync) as f:
            yield f


class MemoryBackend(Backend):
    """memory://: objects in this process (fsspec's memory filesystem), the null-storage floor."""

    shared_between_processes = False

    def check_reachable(self, field_name: str = "url") -> None:
        """Nothing to reach: the objects are in this process."""

    def relative(self, full: str) -> str | None:
        # fsspec's memory filesystem lists paths without their leading '/'
        return super().relative(full if str(full).startswith("/") else "/" + str(full))

    def memory_buffer(self, rel: str) -> memoryview:
        """An object's bytes as a view of its own buffer, without a copy (fsspec's per-call path
        costs ~50 us a request; the loader's null-storage floor reads this)."""
        try:
            return self.fs.store[self.fs._strip_protocol(self.path(rel))].getbuffer()
        except KeyError:
            raise FileNotFoundError(self.path(rel)) from None

    @contextmanager
    def open_output(self, rel: str, fsync: bool = True) -> Iterator[IO]:
        # fsspec's memory files are visible from open(); publish the bytes only at the end.
        buf = io.BytesIO()
        yield buf
        self.fs.pipe_file(self.path(rel), buf.getvalue())


class S3Backend(Backend):
    """S3 through s3fs, its reads optionally through a faster client (``reader``, obstore)."""

    speaks_s3 = True
    supports_bulk_transfer = True

    @property
    def read_client(self) -> str:
        return self.reader.name if self.reader is not None else "s3fs"

    def connect(self) -> None:
        if self.reader is not None:
            # obstore serves the reads; s3fs's botocore session (~0.3 CPU-s) is made only if needed
            self.reader.store(self.root.split("/", 1)[0])
        else:
            self.fs.connect()

    def check_reachable(self, field_name: str = "url") -> None:
        bucket = self.root.split("/", 1)[0]
        where = self.endpoint_url or "the default AWS endpoint"
        if self.endpoint_url:
            # One TCP connect first: a refused or silent endpoint is named in seconds, not after the
            # S3 client's and s3fs's retry ladders (~20 s for a refused port).
            u = urlparse(self.endpoint_url)
            port = u.port or (443 if u.scheme == "https" else 80)
            try:
                socket.create_connection((u.hostname or "", port), timeout=5).close()
            except OSError as e:
                raise EndpointError(field_name, f"cannot reach {where} ({e.strerror or type(e).__name__})",
                                    "check --endpoint-url and that the server is running") from None
        try:
            self.fs.ls(bucket, refresh=True)
        except FileNotFoundError:
            raise EndpointError(field_name, f"bucket {bucket!r} does not exist at {where}",
                                "create it first or pick another bucket") from None
        except PermissionError:
            raise EndpointError(field_name, f"access to bucket {bucket!r} at {where} was denied",
                                "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY") from None
        except Exception as e:  # connection refused, DNS, timeouts -- or no credentials at all
            name = type(e).__name__
            if name in ("NoCredentialsError", "PartialCredentialsError") or "credentials" in str(e).lower():
                raise EndpointError(field_name, f"no usable credentials for {where} ({name})",
                                    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or an AWS profile)") from e
            raise EndpointError(field_name, f"cannot reach {where} ({name})",
                                "check --endpoint-url and that the server is running") from e

    def cat_buffer(self, rel: str, start: int | None, end: int | None):
        if self.reader is not None:   # the fast client serves every read
            return self.reader.get_range(self.path(rel), start, end)
        return super().cat_buffer(rel, start, end)

    def cat_into(self, rel: str, start: int, end: int, out) -> int:
        if self.reader is not None:
            return super().cat_into(rel, start, end, out)
        return _s3fs_get_into(self.fs, self.path(rel), start, end, memoryview(out).cast("B")[:end - start])


# Attempts the S3 client makes per request on its own: botocore's (3, "standard" mode) inside
# s3fs's retry loop (5).  Paths that retry under an iobench RetryPolicy (loader reads, tier
# copies) open their backends with client_attempts=1, so the attempts the user asked for are
# the attempts made and each passes the wrappers (counted, timed, failures in
# ``failed_calls``) instead of hiding inside one measured latency; elsewhere (writers, checks)
# the client's own safety net stays.
CLIENT_ATTEMPTS = 3


def check_endpoint_url(endpoint: str, field: str = "--endpoint-url") -> None:
    """An S3 endpoint as http(s)://host[:port], before any connection (exit 2, one line): a malformed
    one (port out of range, broken IPv6) was a ValueError traceback, and one with ``user:password@``
    reached the server as a host name and failed 13-22 s later as "no usable credentials"."""
    shown = redact_text(endpoint)
    fix = "use e.g. http://127.0.0.1:9000"
    try:
        u = urlparse(endpoint)
        u.port   # noqa: B018 - parses the port: ValueError when out of range
    except ValueError as e:
        raise ConfigError(field, f"{shown!r} is not a usable URL ({e})", fix) from None
    if u.scheme not in ("http", "https"):
        raise ConfigError(field, f"{shown!r} is not an http(s) URL", fix)
    if u.username is not None or u.password is not None:
        raise ConfigError(field, f"{shown!r} carries credentials in the URL, which iobench never uses",
                          "remove user:password@ and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
                          "(or an AWS profile)")
    if not u.hostname:
        raise ConfigError(field, f"{shown!r} names no host", fix)


_NOT_A_FILE_FIX = "replace it with a regular file"


def s3_options(endpoint_url: str | None = None, storage_options: dict | None = None,
               client_attempts: int | None = None) -> dict:
    """s3fs options from flags, then the standard AWS_* environment variables."""
    endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    client_kwargs: dict = {}
    if endpoint:
        check_endpoint_url(endpoint, "--endpoint-url" if endpoint_url else "AWS_ENDPOINT_URL")
        client_kwargs["endpoint_url"] = endpoint
    client_kwargs["region_name"] = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1"
    opts: dict = {"skip_instance_cache": True, "use_listings_cache": False, "client_kwargs": client_kwargs,
                  "config_kwargs": {"connect_timeout": 5, "read_timeout": 60,
                                    "retries": {"max_attempts": client_attempts or CLIENT_ATTEMPTS, "mode": "standard"}}}
    for k, v in (storage_options or {}).items():
        opts[k] = {**opts["client_kwargs"], **v} if k == "client_kwargs" else v
    return opts


def _s3fs_get_into(fs, path: str, start: int, end: int, out: memoryview) -> int:
    """One ranged GET through s3fs, its body copied into ``out`` chunk by chunk as it arrives.

    ``fs.cat_file`` reads the whole body and joins its chunks into a fresh ``bytes``: for an
    8 MiB shard a second full copy plus a page fault per page of the new object, about a
    third of s3fs's CPU per GET on the embedded server.  Here each chunk is copied once, into
    the caller's reused buffer.  Errors are s3fs's own (``_call_s3`` maps S3's to the
    built-ins); a body that ends early comes back as a short count.
    """
    from fsspec.asyn import sync

    bucket, key, _ = fs.split_path(path)

    async def get() -> int:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        body = resp["Body"]
        try:
            got = 0
            while got < len(out):
                n = await body.readinto(out[got:])
                if n == 0:
                    break
                got += n
            return got
        finally:
            body.close()
    return sync(fs.loop, get)


class ObstoreReader:
    """Ranged GETs through obstore's Rust client (connection pool, GIL released while waiting).

    One store per bucket, made on first use (a worker process makes its own).  Its bytes
    come back in a Rust-owned buffer that ``Backend.cat_into`` copies once into the caller's.
    """

    name = "obstore"

    def __init__(self, opts: dict) -> None:
        ck = opts.get("client_kwargs", {})   # (obstore is importable: _s3_reader, the one maker, checked)
        self._config: Any = {k: v for k, v in (("endpoint", ck.get("endpoint_url")), ("region", ck.get("region_name")),
                                          ("access_key_id", opts.get("key")), ("secret_access_key", opts.get("secret")),
                                          ("session_token", opts.get("token"))) if v}
        self._stores: dict = {}

    def __getstate__(self) -> dict:  # stores hold a runtime handle: each process builds its own
        return {"_config": self._config, "_stores": {}}

    def store(self, bucket: str):
        global _OBSTORE_PID
        if _OBSTORE_PID is not None and os.getpid() != _OBSTORE_PID:
            # obstore's Rust runtime does not survive fork(): its threads are gone in the child.
            raise ConfigError("s3 client", "obstore was used in a parent process before this one was forked",
                              "use --s3-client s3fs or the spawn/forkserver start method")
        _OBSTORE_PID = os.getpid()
        st = self._stores.get(bucket)
        if st is None:
            from obstore.store import S3Store

            # No retries inside obstore (its default: 10 over up to 3 minutes): the loader's RetryPolicy
            # owns retries and their time budget.  Timeouts as s3_options gives s3fs.
            st = S3Store(bucket, config={**self._config, "virtual_hosted_style_request": False},
                         client_options={"allow_http": self._config.get("endpoint", "").startswith("http://"),
                                         "connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=60)},
                         retry_config={"max_retries": 0})
            self._stores[bucket] = st
        return st

    def get_range(self, path: str, start: int | None, end: int | None):
        import obstore

        bucket, _, key = path.partition("/")
        from obstore.exceptions import NotFoundError, PermissionDeniedError, UnauthenticatedError

        try:
            if end is None:   # to the end of the object (fsspec's meaning of end=None)
                opts: Any = {"range": {"offset": start}} if start else None
                return obstore.get(self.store(bucket), key, options=opts).bytes()
            return obstore.get_range(self.store(bucket), key, start=start or 0, end=end)
        # obstore's errors are plain Exceptions: map them onto the built-ins the retry policy knows
        # (missing and forbidden are final; the rest, I/O errors that may pass, are retried).
        except NotFoundError as e:
            raise FileNotFoundError(f"s3://{path}: not found") from e
        except (PermissionDeniedError, UnauthenticatedError) as e:
            raise PermissionError(f"s3://{path}: access denied") from e
        except Exception as e:
            raise OSError(f"GET s3://{path}: {type(e).__name__}") from e


_OBSTORE_PID: int | None = None   # the process whose runtime obstore started in (None: not yet)


def _s3_reader(client: str, opts: dict, field_name: str):
    if client not in S3_CLIENTS:
        raise ConfigError(f"{field_name} (s3 client)", f"unknown client {client!r}", nearest(client, S3_CLIENTS))
    if client == "s3fs":
        return None
    try:
        import obstore  # noqa: F401
    except ImportError as e:
        if client == "auto":
            return None
        raise MissingDependencyError("s3 client obstore", "obstore", extra="s3fast") from e
    if client == "auto" and _OBSTORE_PID is not None and os.getpid() != _OBSTORE_PID:
        return None   # forked from a process that ran obstore: its runtime would hang here
    return ObstoreReader(opts)


def planned_read_client(url: str, s3_client: str = "s3fs", endpoint_url: str | None = None,
                        storage_options: dict | None = None) -> str:
    """The client ``open_backend`` would read ``url`` with, without opening it ('fsspec' but for s3://)."""
    if url_protocol(url) != "s3":
        return "fsspec"
    r = _s3_reader(s3_client, s3_options(endpoint_url, storage_options), "load.s3_client")
    return r.name if r is not None else "s3fs"


def open_backend(url: str, endpoint_url: str | None = None, storage_options: dict | None = None,
                 field_name: str = "url", check: bool = False, client_attempts: int | None = None,
                 s3_client: str = "s3fs") -> Backend:
    """Open the storage at ``url`` (local path, file://, s3://bucket/prefix, memory://): the
    factory that picks the class of its storage kind."""
    if not url:
        raise ConfigError(field_name, "is empty", "give a local path, s3://bucket/prefix or memory://name")
    parsed = urlparse(str(url))
    protocol = url_protocol(url)
    if protocol == "file":
        return LocalBackend(url=str(url), protocol="file", root=os.path.abspath(parsed.path if parsed.scheme else str(url)),
                            fs=fsspec.filesystem("file", skip_instance_cache=True))
    if protocol == "memory":
        return MemoryBackend(url=str(url), protocol="memory", root="/" + (parsed.netloc + parsed.path).strip("/"),
                             fs=fsspec.filesystem("memory"))
    if protocol != "s3":
        return _open_fsspec(str(url), protocol, storage_options, field_name)
    try:
        import s3fs
    except ImportError as e:
        raise MissingDependencyError(field_name + " (s3://)", "s3fs", extra="s3") from e
    if not parsed.netloc:
        raise ConfigError(field_name, f"{url!r} names no bucket", "use s3://bucket/prefix")
    opts = s3_options(endpoint_url, storage_options, client_attempts)
    fs = s3fs.S3FileSystem(**opts, **_shared_session(opts))
    if client_attempts is not None:
        fs.retries = client_attempts   # s3fs's own loop around each call (class default: 5)
    backend = S3Backend(url=str(url), protocol="s3", root=(parsed.netloc + parsed.path).rstrip("/"), fs=fs,
                        endpoint_url=opts["client_kwargs"].get("endpoint_url"),
                        reader=_s3_reader(s3_client, opts, field_name))
    if check:
        backend.check_reachable(field_name)
    return backend


# Options under which one botocore session may serve many clients: explicit keys (a session caches
# credentials it resolves itself, and a profile is the session's own).
_SHAREABLE = {"key", "secret", "token", "client_kwargs", "config_kwargs", "skip_instance_cache", "use_listings_cache"}
_SESSIONS: dict[int, object] = {}   # pid -> aiobotocore session (per process: never one inherited by a fork)


def _shared_session(opts: dict) -> dict:
    """``{"session": ...}`` for a new S3FileSystem, or ``{}``.  Every open makes a fresh client (no
    instance cache, its own connections), but a fresh botocore session loads the S3 service model
    again: 0.1-0.4 s per client against ~0.01 s on a shared one (`iobench run` opens an S3 backend
    per generation, ~80 of them in its five generate rounds).  The session holds no connections,
    listings or data; each client still connects and is checked (``check_reachable``) on its own."""
    if not (opts.get("key") and opts.get("secret")) or not set(opts) <= _SHAREABLE:
        return {}
    pid = os.getpid()
    if pid not in _SESSIONS:
        from aiobotocore.session import AioSession

        _SESSIONS[pid] = AioSession()
    return {"session": _SESSIONS[pid]}


def _open_fsspec(url: str, protocol: str, storage_options: dict | None, field_name: str) -> Backend:
    """Any other fsspec protocol (gs, az, hf, http(s), sftp, ...), with fsspec's caches off.

    Credentials come from ``storage_options`` (``--storage-option KEY=VALUE``) or the
    protocol's usual places (environment, profiles, gcloud/az logins); we never log them."""
    if protocol not in registry and protocol not in known_implementations:
        raise ConfigError(field_name, f"unknown URL scheme {protocol!r}",
                          "use a local path, s3://, memory://, or a protocol an installed fsspec package provides")
    opts = dict(storage_options or {})
    opts.setdefault("skip_instance_cache", True)
    if protocol not in ("http", "https"):
        opts.setdefault("use_listings_cache", False)
    try:
        fs = fsspec.filesystem(protocol, **opts)
    except ImportError as e:
        hint = (known_implementations.get(protocol) or {}).get("err") or f"install the fsspec package for {protocol}://"
        raise ConfigError(field_name, f"{protocol}:// needs a package that is not installed", hint) from e
    except TypeError as e:
        raise ConfigError("--storage-option", f"{protocol}:// does not take these options ({e})",
                          "check the KEY names against the filesystem's documentation") from None
    root = url.rstrip("/") if protocol in ("http", "https") else fs._strip_protocol(url).rstrip("/")
    # s3a:// is the S3 API through s3fs as well
    return (S3Backend if protocol == "s3a" else Backend)(url=url, protocol=protocol, root=root, fs=fs)


def parse_storage_options(items: list[str] | None, field_name: str = "--storage-option") -> dict:
    """``KEY=VALUE`` strings into fsspec storage options; values parse as YAML scalars
    (``anon=true`` -> True, ``block_size=1048576`` -> int), dotted keys nest (``client_kwargs.region_name=x``)."""
    out: dict = {}
    for n, item in enumerate(items or [], 1):
        import yaml   # only when there are options: most loads give none (~20 ms of start-up)

        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # not quoted: a mistyped `secret:VALUE` (or a bare secret) is a credential
            raise ConfigError(field_name, f"option {n} ({len(item)} characters, not shown) is not KEY=VALUE",
                              "e.g. --storage-option anon=true")
        try:
            parsed = loads_yaml(value) if value else ""
        except yaml.YAMLError:
            parsed = value
        if not isinstance(parsed, (str, int, float, bool)) and parsed is not None:
            parsed = value
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = parsed
    return out

