"""The tier catalog: which copies of which shards exist on which tier, in SQLite (WAL mode).

Every decision that must be atomic across threads and processes happens inside one
``BEGIN IMMEDIATE`` transaction: a reader finds a ready copy and pins it in the same
transaction, and a stager reserves space (choosing and dropping eviction victims) in
another, so a copy can never be evicted between being found and being pinned.  Space is
reserved *before* bytes are written and victims' files are deleted before the new copy is
written, so the bytes on a tier never exceed its capacity.

Order for LRU/FIFO is a logical clock (``meta.seq``) bumped in each transaction: it is
monotonic across processes and immune to wall-clock steps.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import time
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from ..errors import ConfigError
from .policies import Policy

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('seq', 0);
CREATE TABLE IF NOT EXISTS tiers(
    name TEXT PRIMARY KEY, capacity INTEGER, hwm INTEGER NOT NULL DEFAULT 0,
    evictions INTEGER NOT NULL DEFAULT 0, evicted_bytes INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS datasets(
    id TEXT PRIMARY KEY, source_url TEXT NOT NULL, origin_tier TEXT NOT NULL, shards INTEGER NOT NULL,
    bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS copies(
    dataset TEXT NOT NULL, shard TEXT NOT NULL, tier TEXT NOT NULL,
    bytes INTEGER NOT NULL, checksum TEXT NOT NULL,
    state TEXT NOT NULL,              -- 'ready' | 'staging' (space reserved, bytes being written)
    origin INTEGER NOT NULL DEFAULT 0,  -- 1: the source of truth, never evicted, not counted against capacity
    created_seq INTEGER NOT NULL DEFAULT 0, last_access_seq INTEGER NOT NULL DEFAULT 0,
    accesses INTEGER NOT NULL DEFAULT 0, owner TEXT,
    PRIMARY KEY(dataset, shard, tier));
CREATE INDEX IF NOT EXISTS copies_tier ON copies(tier, state);
CREATE TABLE IF NOT EXISTS pins(
    id INTEGER PRIMARY KEY AUTOINCREMENT, dataset TEXT NOT NULL, shard TEXT NOT NULL, tier TEXT NOT NULL,
    owner TEXT NOT NULL, kind TEXT NOT NULL);   -- kind: 'use' (a reader holds it) | 'pin' (kept until unpinned)
CREATE INDEX IF NOT EXISTS pins_copy ON pins(dataset, shard, tier);
"""

_HOST = socket.gethostname()

# Writers in one process queue on a Python lock per catalog file before ``BEGIN IMMEDIATE``:
# SQLite's busy handler polls by sleeping (1, 2, 5, 10 ms ...), so threads that collide there
# wait longer than the transaction takes (4 staging threads, 400 small shards: ~25 % less
# wall time with the lock).  Other processes still meet at SQLite's lock (busy_timeout).
# Keyed by pid, and reset in a forked child, so no lock crosses a fork.
_WRITE_LOCKS: dict[tuple[int, str], threading.Lock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


# Catalog files this process has checked (iobench.io.inputs.check_sqlite), by pid.  The check
# opens the file; POSIX record locks belong to the process, so closing that descriptor while
# another thread's SQLite connection holds locks on the file drops them (SQLite then reports
# "disk I/O error" to the ranks staging beside it).  So a process checks a catalog once,
# before its first connection, and never opens it outside SQLite again.
_CHECKED: set[tuple[int, str]] = set()
_CHECKED_GUARD = threading.Lock()


def _reset_write_locks() -> None:
    global _WRITE_LOCKS_GUARD, _CHECKED_GUARD
    _WRITE_LOCKS_GUARD = threading.Lock()
    _WRITE_LOCKS.clear()
    _CHECKED_GUARD = threading.Lock()


def _check_once(path: str) -> None:
    from ..io.inputs import check_sqlite

    key = (os.getpid(), os.path.abspath(path))
    with _CHECKED_GUARD:
        if key not in _CHECKED:
            check_sqlite(path, "catalog")   # a FIFO would block connect; a non-SQLite file fails late
            _CHECKED.add(key)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_write_locks)


# the tables an iobench catalog holds (``_SCHEMA``); SQLite's own (sqlite_*) are not counted
OWN_TABLES = frozenset({"meta", "tiers", "datasets", "copies", "pins"})


def refuse_foreign(c: sqlite3.Connection, path: str, field: str) -> None:
    """An existing SQLite database that is not an iobench catalog (the user's own: other tables, no
    ``meta``) is refused before anything is written to it: the WAL switch and the schema would
    change the user's file even when the command then refused it."""
    tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
              if not str(r[0]).startswith("sqlite_")}
    if tables and ("meta" not in tables or not tables <= OWN_TABLES):
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise ConfigError(field, f"{path} is a SQLite database of something else (tables {shown}), not an iobench "
                          "catalog", "give the path of an iobench catalog, or a new file")


def check_catalog_file(path: str, field: str = "catalog") -> None:
    """``path`` can become or is an iobench catalog (``check_sqlite``, then its tables), read only:
    for commands that name a catalog without opening it yet (``tiers init --catalog``)."""
    from urllib.parse import quote

    from ..io.inputs import check_sqlite

    check_sqlite(path, field)
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return
    try:
        c = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?mode=ro&immutable=1", uri=True)   # no -shm, no lock
        try:
            refuse_foreign(c, path, field)
        finally:
            c.close()
    except sqlite3.DatabaseError as e:
        raise ConfigError(field, f"{path} cannot be used as a catalog ({e})",
                          "give the path of an iobench catalog, or a new file") from None


def _write_lock(path: str) -> threading.Lock:
    key = (os.getpid(), os.path.abspath(path))
    lock = _WRITE_LOCKS.get(key)
    if lock is None:
        with _WRITE_LOCKS_GUARD:
            lock = _WRITE_LOCKS.setdefault(key, threading.Lock())
    return lock


def owner_id() -> str:
    return f"{_HOST}:{os.getpid()}"


def owner_alive(owner: str | None) -> bool:
    """False only when the owner is provably gone (a dead process on this host)."""
    if not owner:
        return False
    host, _, pid = owner.rpartition(":")
    if host != _HOST:
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


@dataclass(frozen=True)
class Victim:
    dataset: str
    shard: str
    bytes: int


@dataclass(frozen=True)
class Reservation:
    """Outcome of ``Catalog.reserve``: status is 'reserved', 'ready', 'busy' or 'full'."""

    status: str
    victims: tuple[Victim, ...] = ()
    detail: str = ""


class Catalog:
    """SQLite catalog; one connection per thread and process, opened on first use."""

    def __init__(self, path: str, busy_timeout_s: float = 60.0):
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()

    def __getstate__(self) -> dict:
        return {"path": self.path, "busy_timeout_s": self.busy_timeout_s}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"], state["busy_timeout_s"])

    @property
    def conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "conn", None)
        if c is None or getattr(self._local, "pid", None) != os.getpid():
            _check_once(self.path)
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            try:
                c = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None,
                                    check_same_thread=True)
                self._refuse_foreign(c)
                self._while_locked(self._use_wal, c)
                # NORMAL in WAL mode survives process crashes; a power loss can only lose a
                # recent transaction, whose orphaned files `reconcile` removes.
                c.execute("PRAGMA synchronous=NORMAL")
                c.execute(f"PRAGMA busy_timeout={int(self.busy_timeout_s * 1000)}")
                self._while_locked(self._init_schema, c)
            except sqlite3.DatabaseError as e:
                raise ConfigError("catalog", f"{self.path} cannot be used as a catalog ({e})",
                                  "give the path of an iobench catalog, or a new file") from None
            self._local.conn, self._local.pid = c, os.getpid()
        return c

    def _refuse_foreign(self, c: sqlite3.Connection) -> None:
        try:
            refuse_foreign(c, self.path, "catalog")
        except ConfigError:
            c.close()
            raise

    def _use_wal(self, c: sqlite3.Connection) -> None:
        """Switch the catalog to WAL; the mode is stored in the file: once WAL, nothing to change."""
        if c.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            c.execute("PRAGMA journal_mode=WAL")

    def _while_locked(self, step: Callable[[sqlite3.Connection], None], c: sqlite3.Connection) -> None:
        """Run one start-up step (the WAL switch, the schema), retrying "database is locked".

        Ranks of one job open a new catalog together.  Changing the journal mode needs an
        exclusive lock, and SQLite answers "locked" at once there instead of calling the busy
        handler; a schema statement can meet SQLITE_BUSY too, which rolls its transaction back.
        So the whole step is retried, for as long as the busy timeout allows.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.001
        while True:
            try:
                step(c)
                return
            except sqlite3.OperationalError as e:
                if not ("locked" in str(e) or "busy" in str(e)) or time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 0.05)

    @staticmethod
    @contextmanager
    def _tx(c: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
        c.execute("BEGIN IMMEDIATE")
        try:
            yield c
        except BaseException:
            # SQLite rolls back by itself on some errors (SQLITE_BUSY, _FULL, _IOERR): a second
            # ROLLBACK would fail with "no transaction is active" and hide the error that matters
            if c.in_transaction:
                c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def _init_schema(self, c: sqlite3.Connection) -> None:
        with self._tx(c):
            for stmt in _SCHEMA.strip().split(";"):
                if stmt.strip():
                    c.execute(stmt)

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        c = self.conn
        with _write_lock(self.path), self._tx(c):
            yield c

    def close(self) -> None:
        c = getattr(self._local, "conn", None)
        if c is not None and getattr(self._local, "pid", None) == os.getpid():
            c.close()
        self._local.conn = None

    @staticmethod
    def _next_seq(c: sqlite3.Connection) -> int:
        c.execute("UPDATE meta SET value = value + 1 WHERE key = 'seq'")
        return c.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()[0]

    # ---- registration -------------------------------------------------------------------
    def ensure_tier(self, name: str, capacity: int | None) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO tiers(name, capacity) VALUES (?, ?) "
                      "ON CONFLICT(name) DO UPDATE SET capacity = excluded.capacity", (name, capacity))

    def register_dataset(self, dataset: str, source_url: str, origin_tier: str,
                         shards: list[tuple[str, int, str]]) -> None:
        """Record the dataset and its source copies (the origin: never evicted)."""
        with self.tx() as c:
            c.execute("INSERT OR REPLACE INTO datasets VALUES (?, ?, ?, ?, ?)",
                      (dataset, source_url, origin_tier, len(shards), sum(s[1] for s in shards)))
            c.executemany("INSERT OR IGNORE INTO copies(dataset, shard, tier, bytes, checksum, state, origin) "
                          "VALUES (?, ?, ?, ?, ?, 'ready', 1)",
                          [(dataset, p, origin_tier, b, ck) for p, b, ck in shards])

    # ---- readers -------------------------------------------------------------------------
    def find_and_pin(self, dataset: str, shard: str, tiers: list[str]) -> tuple[str, int] | None:
        """The hottest ready non-origin copy among ``tiers`` (in that order), pinned for use: (tier, pin id)."""
        if not tiers:
            return None
        marks = ",".join("?" * len(tiers))
        # A read (no write lock) answers the common "no cached copy" case; a copy that turns
        # ready just after is the same as asking a moment earlier.  Found: pin it atomically.
        if self.conn.execute(f"SELECT 1 FROM copies WHERE dataset=? AND shard=? AND state='ready' AND origin=0 "
                             f"AND tier IN ({marks}) LIMIT 1", (dataset, shard, *tiers)).fetchall() == []:
            return None
        with self.tx() as c:
            rows = c.execute(f"SELECT tier FROM copies WHERE dataset=? AND shard=? AND state='ready' AND origin=0 "
                             f"AND tier IN ({marks})", (dataset, shard, *tiers)).fetchall()
            found = {r[0] for r in rows}
            for t in tiers:
                if t in found:
                    seq = self._next_seq(c)
                    c.execute("UPDATE copies SET last_access_seq=?, accesses=accesses+1 "
                              "WHERE dataset=? AND shard=? AND tier=?", (seq, dataset, shard, t))
                    cur = c.execute("INSERT INTO pins(dataset, shard, tier, owner, kind) VALUES (?, ?, ?, ?, 'use')",
                                    (dataset, shard, t, owner_id()))
                    return t, int(cur.lastrowid)
        return None

    def pin(self, dataset: str, shard: str, tier: str, kind: str = "pin") -> int | None:
        with self.tx() as c:
            if not c.execute("SELECT 1 FROM copies WHERE dataset=? AND shard=? AND tier=? AND state='ready'",
                             (dataset, shard, tier)).fetchone():
                return None
            cur = c.execute("INSERT INTO pins(dataset, shard, tier, owner, kind) VALUES (?, ?, ?, ?, ?)",
                            (dataset, shard, tier, owner_id(), kind))
            return int(cur.lastrowid)

    def unpin(self, pin_id: int) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM pins WHERE id=?", (pin_id,))

    def unpin_copy(self, dataset: str, shard: str, tier: str, kind: str = "pin") -> int:
        with self.tx() as c:
            return c.execute("DELETE FROM pins WHERE dataset=? AND shard=? AND tier=? AND kind=?",
                             (dataset, shard, tier, kind)).rowcount

    # ---- stagers -------------------------------------------------------------------------
    def reserve(self, dataset: str, shard: str, tier: str, nbytes: int, checksum: str,
                capacity: int | None, policy: Policy) -> Reservation:
        """Reserve ``nbytes`` on ``tier`` for a new copy, choosing eviction victims if needed."""
        return self.reserve_many(dataset, [(shard, nbytes, checksum)], tier, capacity, policy)[0]

    def reserve_many(self, dataset: str, shards: list[tuple[str, int, str]], tier: str, capacity: int | None,
                     policy: Policy) -> list[Reservation]:
        """``reserve`` for several (shard, bytes, checksum) in one transaction, in order: a
        prestage reserves a window of shards ahead of its copiers from one thread, so the
        copier threads never queue on the catalog's write lock."""
        with self.tx() as c:
            return [self._reserve(c, dataset, shard, tier, nbytes, checksum, capacity, policy)
                    for shard, nbytes, checksum in shards]

    def _reserve(self, c: sqlite3.Connection, dataset: str, shard: str, tier: str, nbytes: int, checksum: str,
                 capacity: int | None, policy: Policy) -> Reservation:
        row = c.execute("SELECT state, owner FROM copies WHERE dataset=? AND shard=? AND tier=?",
                        (dataset, shard, tier)).fetchone()
        if row is not None:
            state, owner = row
            if state == "ready":
                return Reservation("ready")
            if owner_alive(owner):
                return Reservation("busy", detail=str(owner))
            c.execute("DELETE FROM copies WHERE dataset=? AND shard=? AND tier=?", (dataset, shard, tier))
        victims: list[Victim] = []
        if capacity is not None:
            used = self._used(c, tier)
            if used + nbytes > capacity:
                self._drop_stale(c, tier)
                used = self._used(c, tier)
            if used + nbytes > capacity:
                if not policy.evicts:
                    return Reservation("full", detail=f"{used} of {capacity} bytes in use; "
                                                      f"policy {policy.name} does not evict")
                need = used + nbytes - capacity
                for ds, sh, b in c.execute(self._victims_sql(policy), (tier,)):
                    victims.append(Victim(ds, sh, b))
                    need -= b
                    if need <= 0:
                        break
                if need > 0:
                    return Reservation("full", detail=f"{used} of {capacity} bytes in use and the rest is "
                                                      "pinned, in use, being staged or the only copy")
                for v in victims:
                    c.execute("DELETE FROM copies WHERE dataset=? AND shard=? AND tier=?", (v.dataset, v.shard, tier))
                c.execute("UPDATE tiers SET evictions=evictions+?, evicted_bytes=evicted_bytes+? WHERE name=?",
                          (len(victims), sum(v.bytes for v in victims), tier))
        seq = self._next_seq(c)
        c.execute("INSERT INTO copies(dataset, shard, tier, bytes, checksum, state, origin, created_seq, "
                  "last_access_seq, owner) VALUES (?, ?, ?, ?, ?, 'staging', 0, ?, ?, ?)",
                  (dataset, shard, tier, nbytes, checksum, seq, seq, owner_id()))
        used = self._used(c, tier)
        c.execute("UPDATE tiers SET hwm=MAX(hwm, ?) WHERE name=?", (used, tier))
        return Reservation("reserved", tuple(victims))

    @staticmethod
    def _used(c: sqlite3.Connection, tier: str) -> int:
        return int(c.execute("SELECT COALESCE(SUM(bytes), 0) FROM copies WHERE tier=? AND origin=0",
                             (tier,)).fetchone()[0])

    @staticmethod
    def _victims_sql(policy: Policy) -> str:
        # Evictable: a ready cache copy, unpinned, with another ready copy somewhere (never the last one).
        return (f"SELECT c.dataset, c.shard, c.bytes FROM copies c WHERE c.tier=? AND c.state='ready' "
                f"AND c.origin=0 "
                f"AND NOT EXISTS (SELECT 1 FROM pins p WHERE p.dataset=c.dataset AND p.shard=c.shard AND p.tier=c.tier) "
                f"AND EXISTS (SELECT 1 FROM copies o WHERE o.dataset=c.dataset AND o.shard=c.shard "
                f"AND o.tier<>c.tier AND o.state='ready') "
                f"ORDER BY c.{policy.order_column}")

    @staticmethod
    def _drop_stale(c: sqlite3.Connection, tier: str) -> None:
        """Forget pins and reservations held by processes that no longer exist."""
        for pid_, owner in c.execute("SELECT id, owner FROM pins WHERE tier=? AND kind='use'", (tier,)).fetchall():
            if not owner_alive(owner):
                c.execute("DELETE FROM pins WHERE id=?", (pid_,))
        for ds, sh, owner in c.execute("SELECT dataset, shard, owner FROM copies WHERE tier=? AND state='staging'",
                                       (tier,)).fetchall():
            if not owner_alive(owner):
                c.execute("DELETE FROM copies WHERE dataset=? AND shard=? AND tier=?", (ds, sh, tier))

    def commit_copy(self, dataset: str, shard: str, tier: str) -> None:
        self.commit_copies(dataset, [shard], tier)

    def commit_copies(self, dataset: str, shards: list[str], tier: str) -> None:
        """Mark written copies ready, in order (each gets its own sequence number), in one transaction."""
        with self.tx() as c:
            for shard in shards:
                seq = self._next_seq(c)
                c.execute("UPDATE copies SET state='ready', owner=NULL, created_seq=?, last_access_seq=? "
                          "WHERE dataset=? AND shard=? AND tier=?", (seq, seq, dataset, shard, tier))

    def abort_copy(self, dataset: str, shard: str, tier: str) -> None:
        with self.tx() as c:
            c.execute("DELETE FROM copies WHERE dataset=? AND shard=? AND tier=? AND state='staging'",
                      (dataset, shard, tier))

    def drop_copy(self, dataset: str, shard: str, tier: str, force: bool = False) -> str:
        """Forget a cache copy before its file is deleted: 'dropped', or why not
        ('absent', 'origin', 'pinned', 'last-copy', 'staging')."""
        with self.tx() as c:
            row = c.execute("SELECT state, origin, bytes FROM copies WHERE dataset=? AND shard=? AND tier=?",
                            (dataset, shard, tier)).fetchone()
            if row is None:
                return "absent"
            state, origin, nbytes = row
            if origin:
                return "origin"
            if state != "ready":
                return "staging"
            if not force:
                self._drop_stale(c, tier)
                if c.execute("SELECT 1 FROM pins WHERE dataset=? AND shard=? AND tier=?",
                             (dataset, shard, tier)).fetchone():
                    return "pinned"
            if not c.execute("SELECT 1 FROM copies WHERE dataset=? AND shard=? AND tier<>? AND state='ready'",
                             (dataset, shard, tier)).fetchone():
                return "last-copy"
            c.execute("DELETE FROM copies WHERE dataset=? AND shard=? AND tier=?", (dataset, shard, tier))
            c.execute("UPDATE tiers SET evictions=evictions+1, evicted_bytes=evicted_bytes+? WHERE name=?",
                      (nbytes, tier))
            return "dropped"

    def add_ready_copy(self, dataset: str, shard: str, tier: str, nbytes: int, checksum: str) -> None:
        """Record a copy written outside ``reserve`` (e.g. on an unbounded tier by a demotion)."""
        with self.tx() as c:
            seq = self._next_seq(c)
            c.execute("INSERT OR REPLACE INTO copies(dataset, shard, tier, bytes, checksum, state, origin, "
                      "created_seq, last_access_seq) VALUES (?, ?, ?, ?, ?, 'ready', 0, ?, ?)",
                      (dataset, shard, tier, nbytes, checksum, seq, seq))

    # ---- queries -------------------------------------------------------------------------
    def usage(self, tier: str) -> dict:
        c = self.conn
        row = c.execute("SELECT capacity, hwm, evictions, evicted_bytes FROM tiers WHERE name=?", (tier,)).fetchone()
        cap, hwm, ev, evb = row if row else (None, 0, 0, 0)
        used = self._used(c, tier)
        ready, n = c.execute("SELECT COALESCE(SUM(bytes),0), COUNT(*) FROM copies WHERE tier=? AND origin=0 "
                             "AND state='ready'", (tier,)).fetchone()
        pinned = c.execute("SELECT COUNT(DISTINCT dataset || '/' || shard) FROM pins WHERE tier=?", (tier,)).fetchone()[0]
        return {"capacity_bytes": cap, "used_bytes": used, "ready_bytes": int(ready), "copies": int(n),
                "pinned_copies": int(pinned), "high_water_mark_bytes": int(hwm), "evictions": int(ev),
                "evicted_bytes": int(evb)}

    def copies(self, dataset: str | None = None, tier: str | None = None, state: str | None = "ready",
               include_origin: bool = False) -> list[dict]:
        sql = "SELECT dataset, shard, tier, bytes, checksum, state, origin, accesses FROM copies WHERE 1=1"
        args: list = []
        for col, val in (("dataset", dataset), ("tier", tier), ("state", state)):
            if val is not None:
                sql += f" AND {col}=?"
                args.append(val)
        if not include_origin:
            sql += " AND origin=0"
        keys = ("dataset", "shard", "tier", "bytes", "checksum", "state", "origin", "accesses")
        return [dict(zip(keys, r)) for r in self.conn.execute(sql + " ORDER BY dataset, shard, tier", args)]

    def datasets(self) -> list[dict]:
        keys = ("id", "source_url", "origin_tier", "shards", "bytes")
        return [dict(zip(keys, r)) for r in self.conn.execute("SELECT * FROM datasets ORDER BY id")]
