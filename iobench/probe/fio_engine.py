"""fio as the file I/O engine: a job file per point, ``--output-format=json`` parsed.

Queue depth: ``qd_model="async"`` gives one job with ``ioengine=libaio iodepth=qd``
(true asynchronous depth with O_DIRECT; buffered libaio completes inline, so fio then
behaves like depth 1 — reported as measured); ``"threads"`` gives ``ioengine=psync
numjobs=qd thread`` — the same model as the built-in engine, used for the comparison.
Latency is fio's total latency (``lat_percentiles=1``), summarised from its percentiles.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from functools import lru_cache

from ..errors import StorageError
from .jobs import Job, JobResult

ENGINE = "fio"
# fio accepts at most 20 percentiles; these give the summary and a latency CDF.
_PERCENTILES = (1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 99, 99.5, 99.9, 99.99)


@lru_cache(maxsize=1)
def find() -> tuple[str, str] | None:
    """(path, version) of fio, or None when it is not installed."""
    path = shutil.which("fio")
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path, out.stdout.strip() or "fio (unknown version)"


def available() -> bool:
    return find() is not None


def describe(job: Job) -> str:
    found = find()
    version = found[1] if found else "fio"
    return f"{version} ioengine={'libaio' if job.qd_model == 'async' else 'psync'}"


def _global(job: Job) -> list[str]:
    return ["[global]", f"filename={job.path}",
            # cache state is set and verified by the probe before fio starts
            "invalidate=0", "time_based=1", f"runtime={max(1, round(job.runtime_s * 1000))}ms",
            "lat_percentiles=1", "percentile_list=" + ":".join(f"{p:g}" for p in _PERCENTILES),
            "group_reporting=1", "disk_util=0", f"randseed={job.seed + 1}", "randrepeat=0"]


def _section(job: Job, name: str = "probe") -> list[str]:
    lines = [f"[{name}]", f"rw={job.rw}", f"bs={job.bs}", f"direct={1 if job.direct else 0}"]
    if job.is_write:
        lines.append("end_fsync=1")
    if job.qd_model == "async":
        lines += ["ioengine=libaio", f"iodepth={job.qd}", f"size={job.file_size}", "numjobs=1"]
    else:
        start, end = job.regions()[0]
        lines += ["ioengine=psync", "iodepth=1", "thread=1", f"numjobs={job.qd}"]
        if job.is_random:
            lines.append(f"size={job.file_size}")
        else:
            lines += [f"size={end - start}", f"offset_increment={end - start}"]
    return lines


def job_file(job: Job) -> str:
    return "\n".join(_global(job) + [""] + _section(job) + [""])


def parse(data: dict, job: Job, text: str) -> JobResult:
    j = data["jobs"][0]
    if j.get("error"):
        raise StorageError(f"fio job failed with error {j['error']} on {job.path}")
    side = j["write" if job.is_write else "read"]
    lat = side.get("lat_ns") or side.get("clat_ns") or {}
    pct = {float(k): v / 1e9 for k, v in (lat.get("percentile") or {}).items()}

    def at(p: float):
        return pct.get(float(p))

    count = int(side.get("total_ios", 0))
    summary = {"count": count,
               "min": lat.get("min", 0) / 1e9 if count else None,
               "mean": lat.get("mean", 0) / 1e9 if count else None,
               "p50": at(50), "p90": at(90), "p99": at(99), "p999": at(99.9),
               "max": lat.get("max", 0) / 1e9 if count else None}
    cdf = [[lat["min"] / 1e9, 0.0]] if count else []
    cdf += [[v, p / 100] for p, v in sorted(pct.items())]
    if count:
        cdf.append([lat["max"] / 1e9, 1.0])
    seconds = (side.get("runtime") or j.get("job_runtime") or 0) / 1000
    return JobResult(engine=ENGINE, engine_detail=f"{data.get('fio version', 'fio')} ioengine="
                     f"{'libaio' if job.qd_model == 'async' else 'psync'}",
                     bytes=int(side.get("io_bytes", 0)), seconds=seconds, ios=count,
                     latency_summary=summary, latency_cdf=cdf, job_file=text)


def _invoke(text: str, timeout_s: float, where: str) -> dict:
    found = find()
    if found is None:
        raise StorageError("fio is not installed")
    proc = subprocess.run([found[0], "--output-format=json", "--eta=never", "-"], input=text, capture_output=True,
                          text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise StorageError(f"fio failed on {where}: {(proc.stderr or proc.stdout).strip()[-500:]}")
    out = proc.stdout
    try:  # fio may print notes before the JSON document
        return json.loads(out[out.index("{"):])
    except ValueError as e:
        raise StorageError(f"fio gave no JSON for {where}: {out[-300:]}") from e


def run(job: Job) -> JobResult:
    text = job_file(job)
    return parse(_invoke(text, job.runtime_s + 120, job.path), job, text)


def run_many(jobs: list[Job]) -> list[JobResult]:
    """Several jobs on the same file in one fio process, one after another (``stonewall``).

    fio's start-up costs about half a second on a busy machine; a sweep of direct or write
    points, which need no cache preparation between them, pays it once.  Each result keeps
    a stand-alone job file equivalent to its section.
    """
    if len(jobs) <= 1:
        return [run(j) for j in jobs]
    lines = _global(jobs[0]) + [""]
    for i, j in enumerate(jobs):
        if (j.path, j.runtime_s, j.seed) != (jobs[0].path, jobs[0].runtime_s, jobs[0].seed):
            raise ValueError("run_many needs jobs on one file with one runtime and seed")
        lines += _section(j, f"p{i}") + ["stonewall", ""]
    data = _invoke("\n".join(lines), sum(j.runtime_s for j in jobs) + 120, jobs[0].path)
    if len(data.get("jobs", [])) != len(jobs):
        raise StorageError(f"fio returned {len(data.get('jobs', []))} results for {len(jobs)} jobs")
    out = []
    for j, jd in zip(jobs, data["jobs"]):
        out.append(parse({"fio version": data.get("fio version"), "jobs": [jd]}, j, job_file(j)))
    return out
