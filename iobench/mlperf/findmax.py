"""``--find-max``: MLPerf Storage's maximum -- the most simulated accelerators on one host node, in one
job, whose result (a warm-up and 5 runs) stays at or above the workload's AU threshold
(mlcommons/storage Submission_guidelines.md §8, §9; a result is the mean of 5 runs, §3) -- and why one
more fails.

Search: grow 1, 2, 4, ... until a probe (one run, no warm-up: cheap, never the answer) fails, then
bisect between the last pass and the first failure.  Then the answer is measured as MLPerf defines
it: a full result at N (``cfg``'s runs and warm-up, 5 and 1 by default); if it fails, N steps down
and is measured again; then a full result at N + 1 must fail (if it passes, N steps up) -- so the
answer stands on two full results, one passing at N and one failing at N + 1.

Each stop is labelled: the failing count is run once more with no I/O (batches of the same size from
memory).  If that passes, storage was the limit (``storage-bound``); if it fails too, the host could
not prepare the batches (``host-bound``: CPU for N accelerators x read threads, copies, the harness).
Beside it, the host's read ceiling (iobench.driver.host_ceiling: the same loader on a copy in
memory): a stop whose delivered bytes/s reach ``HOST_BOUND`` of it is host-bound too, and so is
one whose loader workers waited for a CPU over ``CONTENDED`` of their busy time (``label_stop``).
And the storage's own ceiling (``storage_ceiling``: large parallel reads of the dataset's files,
cold, as fio's sequential job does, in-process): a stop that delivered ``STORAGE_BOUND`` of what the
storage itself reads is storage-bound whatever else the host was short of -- more CPU would not
have read faster.  On a loaded 2-core host a 350 MB/s throttled disk delivered 319 MB/s at its
failing count while the workers waited 34% of their busy time for a CPU: contention alone had
labelled it host-bound (reports/reference/find_max.md).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .run import MlperfConfig, run_mlperf

CONFIRM_STEPS = 3        # at most this many full results below / above the probes' answer
STORAGE_BOUND = 0.85     # delivered >= this share of the storage's own read ceiling: storage is the limit
_PROBE_CHUNK = 4 << 20   # bytes per read of the storage ceiling (fio's large sequential blocks)


def _summary(r: dict, full: bool = False) -> dict:
    return {"accelerators": r["accelerators_per_node"], "passed": r["passed"], "au": r["au"], "au_min": r["au_min"],
            "au_ci95_worst": r["au_ci95_worst"], "worst_accelerator": r["worst_accelerator"],
            "samples_per_s": r["samples_per_s"], "throughput_bytes_per_s": r["throughput_bytes_per_s"],
            "steps_per_accelerator": r["steps_per_accelerator"], "runs": r["runs"], "warmup_run": r["warmup_run"],
            "full_result": full, "rule_verdict": r["rule_verdict"],
            "marginal": bool(r["au_ci95_worst"] and r["au_ci95_worst"][0] < r["au_threshold"]
                             <= r["au_ci95_worst"][1])}


def _ceiling(cfg: MlperfConfig, n: int) -> dict | None:
    """This host's read ceiling for one accelerator's loader (cached per host and batch shape), or None."""
    try:
        from ..driver import host_ceiling
        from ..loader.core import LoadConfig
        from ..manifest import read_manifest
        from ..storage import open_backend
        from .run import _load_fields

        wl, compute_s, _ = cfg.resolve()
        fields = _load_fields(cfg, wl, compute_s, "as-is", cfg.seed, 1)
        manifest = read_manifest(open_backend(cfg.dataset, endpoint_url=cfg.endpoint_url, field_name="dataset"))
        return host_ceiling(LoadConfig(**fields), manifest).to_dict()
    except Exception as e:  # noqa: BLE001 — a label's evidence must not fail the search
        return {"error": f"{type(e).__name__}: {e}"}


def storage_ceiling(cfg: MlperfConfig, threads: int, time_s: float = 3.0) -> dict | None:
    """What the storage itself delivers to ``threads`` parallel large sequential reads of the
    dataset's own files (each thread its share of the files, ``_PROBE_CHUNK`` per read, for about
    ``time_s``): O_DIRECT where the file system takes it, else buffered reads of dropped pages.
    Reads need little CPU, so a loaded host still measures its disk here.  Local datasets only
    (None elsewhere); the pages it touches are dropped again, so the next run stays cold."""
    import mmap
    import os
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ..io.inputs import open_regular
    from ..io.pagecache import drop_pages
    from ..manifest import read_manifest
    from ..storage import open_backend

    backend = open_backend(cfg.dataset, endpoint_url=cfg.endpoint_url, field_name="dataset")
    if not backend.base.is_local:
        return None
    paths = [backend.base.local_path(s.path) for s in read_manifest(backend).shards]
    direct = getattr(os, "O_DIRECT", 0)
    for p in paths:
        drop_pages(p)
    deadline = time.perf_counter() + time_s

    def reader(k: int) -> int:
        buf = mmap.mmap(-1, _PROBE_CHUNK)     # page-aligned, as O_DIRECT needs
        done = 0
        try:
            for p in paths[k::threads]:
                try:
                    fd = open_regular(p, "dataset", flags=direct)
                except OSError:               # EINVAL: no O_DIRECT on this file system
                    fd = open_regular(p, "dataset")
                try:
                    off = 0
                    while (n := os.preadv(fd, [buf], off)) > 0:
                        off += n
                        done += n
                        if n < _PROBE_CHUNK or time.perf_counter() > deadline:
                            break
                finally:
                    os.close(fd)
                if time.perf_counter() > deadline:
                    break
        finally:
            buf.close()
        return done

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        nbytes = sum(pool.map(reader, range(threads)))
    seconds = time.perf_counter() - t0
    for p in paths:
        drop_pages(p)
    return {"bytes_per_s": nbytes / seconds if seconds > 0 else None, "bytes": nbytes, "seconds": seconds,
            "threads": threads, "method": f"{threads} threads of {_PROBE_CHUNK >> 20} MiB sequential reads of the "
                                          "dataset's files, cold (O_DIRECT where taken)"}


def label_stop(no_io_passed: bool, near_ceiling: bool, contention: float | None,
               storage_share: float | None = None) -> str:
    """A failing count's label: ``host-bound`` where the same count fails without I/O; else
    ``storage-bound`` where it delivered ``STORAGE_BOUND`` of what the storage itself reads
    (``storage_share``); else ``host-bound`` where storage delivered near this host's read ceiling,
    or where the loaders' workers waited for a CPU over ``driver.CONTENDED`` of their busy time (the
    read path's CPU was the limit: on a loaded 2-core host the no-I/O run, which does not read,
    still passes); else ``storage-bound``."""
    from ..driver import CONTENDED

    if no_io_passed and storage_share is not None and storage_share >= STORAGE_BOUND:
        return "storage-bound"
    contended = contention is not None and contention > CONTENDED
    return "storage-bound" if no_io_passed and not near_ceiling and not contended else "host-bound"


def _bound(cfg: MlperfConfig, n: int, fail: dict, world) -> dict:
    """Why ``n`` accelerators fail: the same count without I/O, the host's read ceiling and the
    workers' CPU contention tell storage from host."""
    from ..driver import HOST_BOUND

    synthetic = run_mlperf(dataclasses.replace(cfg, accelerators=n, synthetic=True, runs=1, warmup=False), world)
    ceiling = _ceiling(cfg, n)
    cap = (ceiling or {}).get("bytes_per_s") or 0.0
    near_ceiling = bool(cap and fail["throughput_bytes_per_s"] >= HOST_BOUND * cap)
    worst = fail["worst_accelerator"]
    shares = [r["cpu_contention"] for r in fail["per_rank"] if r.get("cpu_contention") is not None]
    contention = max(shares) if shares else None
    wl, _, _ = cfg.resolve()
    try:
        storage = storage_ceiling(cfg, threads=min(16, n * (cfg.workers or wl.read_threads)))
    except Exception as e:  # noqa: BLE001 — a label's evidence must not fail the search
        storage = {"error": f"{type(e).__name__}: {e}"}
    sbps = (storage or {}).get("bytes_per_s")
    share = fail["throughput_bytes_per_s"] / sbps if sbps else None
    bound = label_stop(synthetic["passed"], near_ceiling, contention, share)
    worst_rank = next(r for r in fail["per_rank"] if r["rank"] == worst)
    model = worst_rank.get("au_model")
    why = (f"without I/O the same {n} accelerators reach AU {synthetic['au']:.1%}" +
           (f"; storage delivered {fail['throughput_bytes_per_s'] / 1e6:.1f} MB/s, {fail['throughput_bytes_per_s'] / cap:.0%} "
            f"of this host's read ceiling ({cap / 1e6:.1f} MB/s)" if cap else "") +
           (f"; the loaders' workers waited {contention:.0%} of their busy time for a CPU" if contention is not None
            else "") +
           (f"; the storage itself reads {sbps / 1e6:.1f} MB/s (large parallel reads, cold): {share:.0%} of it was "
            "delivered" if share is not None and sbps else "") + ": " +
           ("the storage path is the limit" if bound == "storage-bound" else
            "this host is the limit (CPU, copies, its read path, the harness), storage aside"))
    return {"accelerators": n, "au": fail["au"], "au_min": fail["au_min"], "worst_accelerator": worst,
            "bound": bound, "au_without_io": synthetic["au"], "au_model_worst": model, "host_ceiling": ceiling,
            "cpu_contention": contention, "storage_ceiling": storage, "storage_share": share,
            "delivered_bytes_per_s": fail["throughput_bytes_per_s"],
            "worst_wait_s": worst_rank["wait_s"], "worst_batch_io_p99_s": worst_rank["batch_io_p99_s"],
            "explanation": why + (f"; the loader model replaying its workers' times gives AU {model:.1%}: the rest "
                                  "of the gap is hand-off, the consumer late to take ready batches while the "
                                  "workers read (a loaded host)"
                                  if model is not None and model >= fail["au_threshold"] else "")}


def find_max(cfg: MlperfConfig, max_accelerators: int = 64, world=None,
             say: Callable[[str], None] = lambda s: None) -> dict:
    probe_cfg = dataclasses.replace(cfg, runs=1, warmup=False)
    probes: dict[int, dict] = {}
    fulls: dict[int, dict] = {}

    def probe(n: int) -> bool:
        r = run_mlperf(dataclasses.replace(probe_cfg, accelerators=n), world)
        probes[n] = r
        say(f"  probe {n} accelerator(s): AU {r['au']:.1%} ({'pass' if r['passed'] else 'FAIL'}), "
            f"{r['MB_per_s_read']:.1f} MB/s")
        return r["passed"]

    def full(n: int) -> bool:
        r = run_mlperf(dataclasses.replace(cfg, accelerators=n), world)
        fulls[n] = r
        say(f"  full result at {n} ({'1 warm-up + ' if r['warmup_run'] else ''}{r['runs']} run(s)): AU {r['au']:.1%} "
            f"({'pass' if r['passed'] else 'FAIL'})")
        return r["passed"]

    last_pass, first_fail, n = 0, None, 1
    while True:
        if not probe(n):
            first_fail = n
            break
        last_pass = n
        if n >= max_accelerators:
            break
        n = min(2 * n, max_accelerators)
    if first_fail is not None:
        lo, hi = last_pass, first_fail
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(mid):
                lo = mid
            else:
                hi = mid
        last_pass, first_fail = lo, hi
    # The answer as MLPerf defines it: a full result passing at N, one failing at N + 1.
    answer = last_pass
    for _ in range(CONFIRM_STEPS):
        if answer == 0 or full(answer):
            break
        answer -= 1
    for _ in range(CONFIRM_STEPS):
        above = answer + 1
        if above > max_accelerators or (above in fulls and not fulls[above]["passed"]):
            break
        if not full(above):
            break
        answer = above
    best = fulls.get(answer)
    limit = answer >= max_accelerators
    fail_n = None if limit else answer + 1
    fail = fulls.get(fail_n) if fail_n is not None else None
    if fail is None and fail_n is not None:
        fail = probes.get(fail_n)
    why = None
    if fail is not None and fail_n is not None:
        say(f"  {fail_n} accelerator(s) again without I/O, to tell storage-bound from host-bound ...")
        why = _bound(cfg, fail_n, fail, world)
    ref = best or fail or probes[min(probes)]
    return {
        "workload": ref["workload"], "accelerator": ref["accelerator"], "au_threshold": ref["au_threshold"],
        "max_accelerators_per_node": answer, "search_limit": max_accelerators,
        "limit_reached": limit,
        "confirmed": best is not None and (limit or (fail_n in fulls and not fulls[fail_n]["passed"])),
        "at_max": _summary(best, True) if best else None,
        "next_step": why,
        "probes": [_summary(probes[k]) for k in sorted(probes)],
        "full_results": [_summary(fulls[k], True) for k in sorted(fulls)],
        "headline": headline(ref["workload"], ref["accelerator"], ref["au_threshold"], answer, why, limit,
                             max_accelerators),
        "rule_verdict": best["rule_verdict"] if best else None,
        "result_at_max": best,
    }


def headline(workload: str, accelerator: str, threshold: float, n: int, why: dict | None, limit: bool,
             max_n: int) -> str:
    acc = accelerator.upper()
    if n == 0:
        s = f"this storage cannot keep even 1 simulated {acc} at AU >= {threshold:.0%} on {workload}"
    else:
        s = f"this storage keeps {n} simulated {acc}{'s' if n != 1 else ''} per node at AU >= {threshold:.0%} on {workload}"
    if why:
        s += f"; the {_ordinal(why['accelerators'])} stalls at {why['au']:.0%}: {why['bound']}"
    elif limit:
        s += f" (the search stopped at its limit of {max_n}; raise --max-accelerators)"
    return s


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
