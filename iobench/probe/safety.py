"""The one place a probe may write: a directory or bucket prefix, with a ledger of what it made.

A probe never touches anything it did not create.  ``ProbeArea.open()`` refuses a
non-empty target unless ``force`` is given, and even then writes only inside a fresh
``.iobench-probe-<token>`` folder below it; ``reserve()`` enforces the footprint cap
(``--size``) before any byte is written; ``close()`` deletes exactly the files and folders
in the ledger (folders only when empty), so a user's file that appears meanwhile survives.
"""

from __future__ import annotations

import os
import secrets
import threading
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..storage import Backend, open_backend
from ..units import format_bytes

WORK_PREFIX = ".iobench-probe-"


def _s3_objects(backend: Backend, limit: int) -> list[str]:
    """Keys of real objects under the prefix (directory markers some servers show are not objects)."""
    from fsspec.asyn import sync

    bucket, _, prefix = backend.root.partition("/")
    kw = {"Bucket": bucket, "MaxKeys": limit}
    if prefix:
        kw["Prefix"] = prefix.rstrip("/") + "/"

    async def go():
        s3 = await backend.fs.set_session()
        return await s3.list_objects_v2(**kw)

    resp = sync(backend.fs.loop, go)
    return [o["Key"] for o in resp.get("Contents") or [] if not o["Key"].endswith("/")]


@dataclass
class ProbeArea:
    backend: Backend                   # the target the user named
    size_cap: int                      # bytes the probe may occupy at once
    force: bool = False
    work: Backend | None = None        # our own folder below the target
    reserved: int = 0
    _files: set = field(default_factory=set, repr=False)     # paths relative to work
    _dirs: list = field(default_factory=list, repr=False)    # local folders we made, in creation order
    _created_target: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def open(cls, url: str, size_cap: int, force: bool = False, endpoint_url: str | None = None,
             storage_options: dict | None = None, field_name: str = "url") -> "ProbeArea":
        backend = open_backend(url, endpoint_url=endpoint_url, storage_options=storage_options,
                               field_name=field_name, check=True)
        if not (backend.is_local or backend.speaks_s3):
            raise ConfigError(field_name, f"cannot probe {backend.protocol}:// storage",
                              "give a local directory or s3://bucket/prefix")
        area = cls(backend=backend, size_cap=size_cap, force=force)
        area._claim(field_name)
        return area

    @classmethod
    def adopt(cls, url: str, work_url: str, size_cap: int, endpoint_url: str | None = None,
              storage_options: dict | None = None) -> "ProbeArea":
        """Work inside a folder another process claimed (MPI ranks share rank 0's), keeping
        this process's own ledger: it deletes only what it created; the claimer removes the folder."""
        backend = open_backend(url, endpoint_url=endpoint_url, storage_options=storage_options, field_name="url")
        work = open_backend(work_url, endpoint_url=endpoint_url, storage_options=storage_options, field_name="url")
        if not work.url.rstrip("/").startswith(backend.url.rstrip("/") + "/"):
            raise ConfigError("url", f"{work_url} is not below {url}", "launch every rank with the same URL")
        return cls(backend=backend, size_cap=size_cap, force=True, work=work)

    # -- setup -------------------------------------------------------------------------------
    def _claim(self, field_name: str) -> None:
        b = self.backend
        if b.is_local:
            root = b.root
            if os.path.exists(root) and not os.path.isdir(root):
                raise ConfigError(field_name, f"{root} is a file, not a directory", "give a directory to probe")
            if not os.path.exists(root):
                parent = os.path.dirname(root.rstrip("/")) or "/"
                if not os.path.isdir(parent):
                    raise ConfigError(field_name, f"{parent} does not exist", "create the parent directory first")
                os.mkdir(root)
                self._created_target = True
            entries = os.listdir(root)
        else:
            entries = _s3_objects(b, limit=1000)
        if entries and not self.force:
            raise ConfigError(field_name, f"{b.url} is not empty ({len(entries)} entries)",
                              "give an empty directory or prefix, or pass --force "
                              "(the probe then works in its own subfolder and removes only its own files)")
        for _ in range(8):
            work = b.child(WORK_PREFIX + secrets.token_hex(4))
            if b.is_local:
                try:
                    os.mkdir(work.root)  # fails if it exists: never adopt someone else's folder
                except FileExistsError:
                    continue
                self._dirs.append(work.root)
            elif _s3_objects(work, limit=1):
                continue
            self.work = work
            return
        raise ConfigError(field_name, f"cannot find a free {WORK_PREFIX}* name under {b.url}", "clean up old probe folders")

    # -- ledger ------------------------------------------------------------------------------
    def reserve(self, nbytes: int, what: str = "probe data") -> None:
        """Account for ``nbytes`` more on the target; refuses to pass the --size cap."""
        with self._lock:
            if self.reserved + nbytes > self.size_cap:
                raise ConfigError("--size", f"{what} needs {format_bytes(self.reserved + nbytes)} in all, "
                                  f"above the cap of {format_bytes(self.size_cap)}",
                                  "raise --size or choose smaller request/object sizes")
            self.reserved += nbytes

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.reserved = max(0, self.reserved - nbytes)

    def fits(self, nbytes: int) -> bool:
        return self.reserved + nbytes <= self.size_cap

    def track(self, rel: str) -> str:
        """Record that the probe created ``rel`` (relative to its work folder); returns its full path."""
        with self._lock:
            self._files.add(rel)
        return self.work.path(rel)

    def track_many(self, rels) -> None:
        with self._lock:
            self._files.update(rels)

    def forget(self, rel: str) -> None:
        """The probe removed ``rel`` itself."""
        with self._lock:
            self._files.discard(rel)

    def makedirs(self, rel: str) -> str:
        """Create a local folder below the work folder, remembering each level we made."""
        full = self.work.path(rel)
        if not self.backend.is_local:
            return full
        missing = []
        p = full
        while not os.path.isdir(p):
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            with self._lock:
                self._dirs.append(d)
        return full

    @property
    def created(self) -> int:
        return len(self._files)

    # -- teardown ----------------------------------------------------------------------------
    def close(self) -> None:
        """Delete what the ledger names, and nothing else."""
        if self.work is None:
            return
        files = sorted(self._files)
        if self.backend.is_local:
            for rel in files:
                try:
                    os.unlink(self.work.path(rel))
                except FileNotFoundError:
                    pass
            for d in sorted(self._dirs, key=len, reverse=True):
                try:
                    os.rmdir(d)
                except OSError:
                    pass  # not empty: something we did not create is inside
            if self._created_target:
                try:
                    os.rmdir(self.backend.root)
                except OSError:
                    pass
        else:
            paths = [self.work.path(rel) for rel in files]
            for i in range(0, len(paths), 1000):
                try:
                    self.backend.fs.rm(paths[i:i + 1000])
                except FileNotFoundError:
                    pass
        self._files.clear()
        self._dirs.clear()
        self.reserved = 0

    def __enter__(self) -> "ProbeArea":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def describe(self) -> dict:
        return {"target": self.backend.describe(), "work_prefix": self.work.url if self.work else None,
                "size_cap_bytes": self.size_cap, "force": self.force}
