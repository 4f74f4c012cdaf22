"""`iobench smoke`: a short end-to-end check against an S3-compatible store, for CI.

Checks, in order: reach the bucket; write a small dataset (``iobench.generate``); verify
it; read it back through the loader with stall measurement; commit two small checkpoints
(``iobench.checkpointing``) and restore the newest; remove every object the run wrote.
Each check has a deadline (SIGALRM in the main thread), so a server that stops answering
is a failed check, never a hang.  Every check is a JUnit test case.

Bad flags are bad input (exit 2); anything the store does wrong is a failed check (exit 1).
"""

from __future__ import annotations

from .schema import STALL_RATIO
import re
import secrets
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from .errors import ConfigError

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
CHECKS = ("connect", "write dataset", "verify dataset", "read with stall measurement", "checkpoint commit",
          "checkpoint restore", "cleanup")


class CheckTimeout(Exception):
    pass


@dataclass
class Check:
    name: str
    status: str = "skipped"           # passed | failed | skipped
    seconds: float = 0.0
    message: str = ""
    detail: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "seconds": self.seconds, "message": self.message,
                "detail": self.detail}


@dataclass
class SmokeReport:
    endpoint_url: str | None
    bucket: str
    prefix: str
    checks: list[Check]
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(c.status == "passed" for c in self.checks)

    def metrics(self) -> dict:
        out: dict = {"passed": self.passed, "seconds": self.seconds,
                     "checks": [c.to_dict() for c in self.checks],
                     "failed": [c.name for c in self.checks if c.status == "failed"]}
        for c in self.checks:
            for k in (STALL_RATIO, "accelerator_utilization", "batch_wait_s", "throughput", "restore_s",
                      "blocking_s", "commit_latency_s"):
                if k in c.detail:
                    out[k] = c.detail[k]
        return out


def validate(bucket: str, prefix: str | None, endpoint_url: str | None, timeout_s: float) -> str:
    """Check the flags (exit 2 on bad ones); returns the prefix this run will write under."""
    from .storage import s3_options

    if not _BUCKET.match(bucket or "") or ".." in bucket:
        raise ConfigError("--bucket", f"{bucket!r} is not a valid S3 bucket name",
                          "use 3-63 lowercase letters, digits, dots or hyphens")
    s3_options(endpoint_url)   # rejects an endpoint that is not an http(s) URL
    if timeout_s <= 0:
        raise ConfigError("--timeout", f"must be positive, got {timeout_s}", "give seconds per check, e.g. 120")
    if prefix is None:
        prefix = f"iobench-smoke/{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
    prefix = prefix.strip("/")
    if not prefix or ".." in prefix.split("/"):
        raise ConfigError("--prefix", f"{prefix!r} is not a usable key prefix", "give e.g. ci/smoke")
    return prefix


@contextmanager
def deadline(seconds: float):
    """Raise CheckTimeout in the main thread after ``seconds`` (no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum, frame):
        raise CheckTimeout(f"no answer within {seconds:g} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _unreachable(e: BaseException) -> bool:
    from .errors import EndpointError

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (EndpointError, ConnectionError)) or "EndpointConnection" in type(e).__name__ \
                or "ConnectTimeout" in type(e).__name__:
            return True
        e = e.__cause__ or e.__context__
    return False


def _describe(e: BaseException) -> str:
    msg = str(e) or type(e).__name__
    return f"{type(e).__name__}: {msg}"[:500]


# The read's defaults: a healthy local S3 (the embedded server on a busy 2-core host: 16 ranged GETs
# of 512 B per batch, a few ms each) keeps up with a 50 ms step at 2 workers, so the default gate
# (MAX_STALL) fails only a store that is slow or misbehaving; 40 steps give the stall an interval.
# (At 5 ms and 12 steps, one worker, the same server stalled 64-91%: the gate measured the step.)
READ_STEPS, READ_STEP_S, MAX_STALL = 40, 0.050, 0.5


def run_smoke(endpoint_url: str | None, bucket: str, prefix: str | None = None, storage_options: dict | None = None,
              timeout_s: float = 120.0, max_stall: float | None = MAX_STALL,
              on_check: Callable[[Check], None] | None = None, steps: int = READ_STEPS,
              step_s: float = READ_STEP_S) -> SmokeReport:
    """Run every check; never raises for what the store does (only ConfigError for bad arguments)."""
    prefix = validate(bucket, prefix, endpoint_url, timeout_s)
    if steps < 2:
        raise ConfigError("--steps", f"must be at least 2, got {steps}", "e.g. --steps 40")
    if step_s <= 0:
        raise ConfigError("--step-time", f"must be above zero, got {step_s}", "e.g. --step-time 50ms")
    if max_stall is not None and not 0 <= max_stall <= 1:
        raise ConfigError("--max-stall", f"must be between 0 and 1, got {max_stall}", "give e.g. 0.5")
    root = f"s3://{bucket}/{prefix}"
    data_url, ckpt_url = f"{root}/data", f"{root}/ckpt"
    checks = {name: Check(name) for name in CHECKS}
    state: dict = {}
    t_start = time.perf_counter()

    def connect(c: Check):
        from .storage import open_backend

        backend = open_backend(root, endpoint_url=endpoint_url, storage_options=storage_options, field_name="--bucket")
        backend.check_reachable("--bucket")
        state["backend"] = backend
        c.detail["endpoint_url"] = backend.endpoint_url

    def write(c: Check):
        from .generate import GenSpec, generate

        spec = GenSpec.from_mapping({"format": "raw", "modality": "tokens", "num_samples": 256, "seq_len": 256,
                                     "shard_size": "64 samples", "seed": 7})
        stats: dict = {}
        m = generate(spec, data_url, endpoint_url=endpoint_url, storage_options=storage_options, progress=False,
                     stats=stats)
        c.detail.update(bytes=m.total_bytes, shards=len(m.shards), samples=m.total_samples)
        if stats.get("seconds"):
            c.detail["throughput"] = {"bytes_per_s": m.total_bytes / max(stats["seconds"], 1e-9)}

    def verify(c: Check):
        from .verify import verify_dataset

        rep = verify_dataset(data_url, endpoint_url=endpoint_url, storage_options=storage_options)
        c.detail["ok"] = rep.ok
        if not rep.ok:
            raise AssertionError(f"dataset does not match its manifest: {rep.first_bad}")

    def read(c: Check):
        # the one measurement driver (iobench.driver), as `iobench check` reads: cold, judged the same way
        from .driver import Dataset, DriveConfig, measure
        from .loader.core import LoadConfig
        from .manifest import read_manifest
        from .storage import open_backend

        cfg = LoadConfig(dataset=data_url, endpoint_url=endpoint_url, workers=2, prefetch=2, batch_size=16,
                         steps=steps, compute=f"{step_s * 1e3}ms", cache="cold", shuffle_buffer=64,
                         monitor_interval_s=1.0, retries=2, retry_budget_s=10.0)
        manifest = read_manifest(open_backend(data_url, endpoint_url=endpoint_url, storage_options=storage_options))
        o = measure(DriveConfig(load=cfg, host_ceiling="off", one_pass_when_cold=False),
                    Dataset(url=data_url, format=manifest.format), manifest, storage_options)
        m = o.metrics
        c.detail.update(stall_ratio=m.get(STALL_RATIO), stall_interval=(m.get("intervals") or {}).get(STALL_RATIO),
                        accelerator_utilization=m.get("accelerator_utilization"),
                        batch_wait_s=m.get("batch_wait_s"), throughput=m.get("throughput"),
                        steps=m.get("steps"), step_s=step_s, bytes_read=m.get("bytes_read"),
                        capacity_bytes_per_s=o.rates.capacity_bytes_per_s, cause=o.judgement.cause,
                        cache=o.cache.get("note") or o.cache.get("declared"))
        if not m.get("bytes_read"):
            raise AssertionError("the loader read no bytes")
        if max_stall is not None and m.get(STALL_RATIO, 0) > max_stall:
            raise AssertionError(f"data stall {m[STALL_RATIO]:.1%} at a {step_s * 1e3:g} ms step exceeds "
                                 f"--max-stall {max_stall:.1%} (limit: {o.judgement.cause})")

    def commit(c: Check):
        from .checkpointing.runner import CkptConfig, open_tiers, run_saves

        cfg = CkptConfig(params=2_000_000, count=2, mode="async", durable=ckpt_url, endpoint_url=endpoint_url,
                         keep_durable=2, seed=7)
        _, durable = open_tiers(None, ckpt_url, endpoint_url, storage_options, check=False)
        state["durable"] = durable
        m = run_saves(cfg, None, durable, progress=False)
        c.detail.update(saves=m["saves"], blocking_s=m["blocking_s"], commit_latency_s=m["commit_latency_s"],
                        bytes_per_save=m["state"]["bytes_per_save"])
        if m["saves"].get("committed", 0) != cfg.count:
            raise AssertionError(f"committed {m['saves'].get('committed', 0)} of {cfg.count} checkpoints: {m['saves']}")

    def restore(c: Check):
        from .checkpointing.runner import run_restore

        _, m = run_restore(None, state["durable"])
        c.detail.update(step=m["step"], restore_s=m["restore_s"], verified=m["verified"], bytes=m["restore_bytes"])
        if m["step"] != 2 or not m["verified"]:
            raise AssertionError(f"restored step {m['step']} (verified={m['verified']}), expected the newest, step 2")

    def cleanup(c: Check):
        backend = state["backend"]
        try:
            backend.fs.rm(backend.root, recursive=True)
        except FileNotFoundError:
            pass
        # Some stores (SeaweedFS) answer for the emptied prefix itself, as a directory; only keys below count.
        left = [k for k in backend.fs.find(backend.root) if k.rstrip("/") != backend.root.rstrip("/")]
        c.detail["objects_left"] = len(left)
        if left:
            raise AssertionError(f"{len(left)} objects left under {root}")

    plan = [("connect", connect), ("write dataset", write), ("verify dataset", verify),
             ("read with stall measurement", read), ("checkpoint commit", commit), ("checkpoint restore", restore)]
    failed_at = None
    try:
        for name, fn in plan:
            c = checks[name]
            if failed_at is not None or (name == "checkpoint restore"
                                         and checks["checkpoint commit"].status != "passed"):
                c.message = f"not run: '{failed_at or 'checkpoint commit'}' failed"
                c.status = "skipped"
            else:
                _run(c, fn, timeout_s)
                if c.status == "failed" and (name in ("connect", "write dataset") or c.detail.get("unreachable")):
                    failed_at = name
            if on_check:
                on_check(c)
    except KeyboardInterrupt:   # Ctrl-C or SIGTERM (iobench.cli): the scratch prefix goes too, then the exit
        if "backend" in state:
            _run(checks["cleanup"], cleanup, min(timeout_s, 30.0))
        raise
    c = checks["cleanup"]
    if "backend" in state:
        _run(c, cleanup, timeout_s)
    else:
        c.message = "not run: could not connect"
    if on_check:
        on_check(c)
    return SmokeReport(endpoint_url, bucket, prefix, list(checks.values()), time.perf_counter() - t_start)


def _run(c: Check, fn, timeout_s: float) -> None:
    t0 = time.perf_counter()
    try:
        with deadline(timeout_s):
            fn(c)
        c.status = "passed"
    except CheckTimeout as e:
        c.status, c.message = "failed", f"timed out: {e}"
    except Exception as e:  # noqa: BLE001 - a store that misbehaves in any way is a failed check
        c.status, c.message = "failed", _describe(e)
        # Once the store stops answering, later checks would only wait out their retries.
        c.detail["unreachable"] = _unreachable(e)
    finally:
        c.seconds = time.perf_counter() - t0


def junit_xml(report: SmokeReport) -> bytes:
    import xml.etree.ElementTree as ET

    failures = sum(c.status == "failed" for c in report.checks)
    skipped = sum(c.status == "skipped" for c in report.checks)
    suites = ET.Element("testsuites", name="iobench smoke", tests=str(len(report.checks)), failures=str(failures),
                        errors="0", skipped=str(skipped), time=f"{report.seconds:.3f}")
    suite = ET.SubElement(suites, "testsuite", name="iobench smoke", tests=str(len(report.checks)),
                          failures=str(failures), errors="0", skipped=str(skipped), time=f"{report.seconds:.3f}")
    props = ET.SubElement(suite, "properties")
    for k, v in (("endpoint_url", report.endpoint_url or "(AWS default)"), ("bucket", report.bucket),
                 ("prefix", report.prefix)):
        ET.SubElement(props, "property", name=k, value=str(v))
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname="iobench.smoke", name=c.name, time=f"{c.seconds:.3f}")
        if c.status == "failed":
            ET.SubElement(case, "failure", message=c.message, type="SmokeCheckFailed").text = c.message
        elif c.status == "skipped":
            ET.SubElement(case, "skipped", message=c.message)
    from .results import redact_text

    # every attribute and text (properties, failure messages) through the one redaction function
    body = redact_text(ET.tostring(suites, encoding="unicode"))
    return ("<?xml version='1.0' encoding='utf-8'?>\n" + body).encode("utf-8")
