"""What every benchmark shares: the machine, paired alternating rounds, ratios, the report files.

Measurement rule 8 ("ratios, same run", docs/design.md): on a shared machine absolute times
are noise, so iobench and its peer run in the same rounds, in alternating order (A B, B A, ...:
a drift in the machine's load favours neither), and each round gives one ratio; a row reports
the median of them, with their spread.

A benchmark script here is: an argument parser (``parser``, ``sections_option``), a scratch
directory (``scratch``) with its data (``dataset``: one ``iobench gen``), sections that time sides
with ``alternating`` (the peers through ``fio`` or ``run_json`` for a peer process, iobench as a
user runs it through ``iobench_json``) and turn them into rows (``paired_row``: the median
per-round ratio; ``row``, ``skipped``), and ``write_report`` / ``write_results``: OUT.json
(everything; ``run_meta``: how, where and when it ran), OUT.md (its own table, from ``header`` or
``run_line``, ``table`` and the hand-written ``notes``) and, where the script has peer rows,
OUT.rows.json (``summary.write_rows``: what benchmarks/summary.py collects).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from iobench.results import host_info

REF = Path(__file__).resolve().parents[1] / "reports" / "reference"
SHARED = "a shared 2-core VM: other work ran while measuring, so only same-run ratios are meaningful"
MiB = 2**20


# ------------------------------------------------------------------ the machine

def machine(**extra) -> dict:
    """The host (``iobench.results.host_info``, as every results file records it), its load average
    now, and the note that it was shared; ``extra`` adds a benchmark's own facts."""
    info = host_info()
    info.pop("hostname", None)
    return {**info, "load_avg_at_start": [round(x, 2) for x in os.getloadavg()], "note": SHARED, **extra}


def machine_line(m: dict, unit: str = "cores") -> str:
    """'2 cores, 8 GiB, Linux ..., Python 3.x' from ``machine()`` (or ``host_info()``)."""
    return f"{m['cpu_count']} {unit}, {m['memory_bytes'] / 2**30:.0f} GiB, {m['os']}, Python {m['python']}"


def loadavg(m=None) -> str:
    """The 1, 5 and 15 minute load averages as text: now, at the start of ``machine()``'s dict ``m``, or a
    recorded list ``m``."""
    xs = os.getloadavg() if m is None else m["load_avg_at_start"] if isinstance(m, dict) else m
    return ", ".join(f"{x:.1f}" for x in xs)


def filesystem(where: str | Path) -> dict:
    """The file system type and device ``where`` lies on (``df -T``)."""
    df = subprocess.run(["df", "-T", str(where)], capture_output=True, text=True).stdout.splitlines()[-1].split()
    return {"type": df[1], "device": df[0]}


def fio_version() -> str:
    return subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()


def notes(name: str) -> str:
    """The hand-written notes on a benchmark's numbers, ``reports/reference/NAME.notes.md`` (kept
    across reruns, and where numbers measured once belong: docs/design.md's note on design notes)."""
    f = REF / f"{name}.notes.md"
    return f.read_text().strip() if f.exists() else ""


# ------------------------------------------------------------------ paired alternating rounds

def alternating(rounds: int, sides: dict[str, Callable[[], Any]],
                after: dict[str, Callable[[int], Any]] | None = None) -> dict[str, list]:
    """Run every side once per round, the order reversed every other round, then each of ``after``
    (given the round's number) in its fixed order; each one's values."""
    names = list(sides)
    out: dict[str, list] = {n: [] for n in [*names, *(after or {})]}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            out[n].append(sides[n]())
        for n, fn in (after or {}).items():
            out[n].append(fn(r))
    return out


def _value(x, key: str | None):
    return x if key is None else (x or {}).get(key)


def ratios(ours: list, peer: list, key: str | None = None) -> dict:
    """Per-round ratios ours / peer (of ``key`` when the rounds are dicts), in round order, sorted,
    their median and spread; rounds where either side has no value are left out."""
    seq = [a / b for a, b in ((_value(x, key), _value(y, key)) for x, y in zip(ours, peer)) if a and b]
    return {"in_round_order": seq, "per_round": sorted(seq), "median": statistics.median(seq) if seq else None,
            "spread": [min(seq), max(seq)] if seq else None}


def median(runs: list, key: str | None = None):
    """The median of the values (of ``key``) that are not None; None if there are none."""
    vals = [v for v in (_value(r, key) for r in runs) if v is not None]
    return statistics.median(vals) if vals else None


def median_run(runs: list[dict], key: str) -> dict:
    """The run whose ``key`` is the median (the upper one of an even count)."""
    ok = sorted((r for r in runs if r.get(key) is not None), key=lambda r: r[key])
    return ok[len(ok) // 2] if ok else {}


# ------------------------------------------------------------------ timing and the peers' tools

def met(ratio, target, direction: str = ">=") -> bool | None:
    """Whether ``ratio`` meets a numeric ``target`` (None without a target or a ratio)."""
    if not isinstance(target, (int, float)):
        return None
    return ratio is not None and (ratio >= target if direction == ">=" else ratio <= target)


def row(section: str, metric: str, ours, peer, ratio, target, note: str, **extra) -> dict:
    """One results row, the shape summary.py reads: ``section``, ``metric``, both sides, ``ratio``, ``target``, ``met``."""
    return {"section": section, "metric": metric, "iobench": ours, "peer": peer, "ratio": ratio, "target": target,
            "met": met(ratio, target), "note": note, **extra}


def paired_row(section: str, ours: list[dict], peer: list[dict], metric: str, target, note: str, **extra) -> dict:
    """A row from alternating rounds of dicts: the median of the per-round ratios of ``metric`` (the host
    swings between rounds, so each round's pair is the comparison), each side's median run beside it."""
    r = ratios(ours, peer, metric)
    rounds = {"per_round_ratios": r["per_round"], "median_ratio": r["median"], "in_round_order": r["in_round_order"]}
    return row(section, metric, median_run(ours, metric), median_run(peer, metric), r["median"], target, note,
               rounds=rounds, **extra)


def skipped(section: str, why: str) -> list[dict]:
    return [{"section": section, "skipped": why}]


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, fn()'s result)."""
    t0 = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t0) / 1e9, out


def cpu_seconds(children_only: bool = False) -> float:
    """User + system CPU seconds of this process and its waited-for children so far."""
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    if children_only:
        return c.ru_utime + c.ru_stime
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def whole_process(args: list[str], timeout: float = 900, **kw) -> tuple[float, subprocess.CompletedProcess, float]:
    """Run a process to its exit, output captured as text: (wall seconds, the finished process, the CPU
    seconds, user + system, of it and its children)."""
    c0 = cpu_seconds(children_only=True)
    t, p = timed(lambda: subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw))
    return t, p, cpu_seconds(children_only=True) - c0


def fio(*options: str, timeout: float = 900) -> tuple[float, dict]:
    """``fio --output-format=json --group_reporting OPTIONS``: (wall seconds, the first job's report)."""
    t, p = timed(lambda: subprocess.run(["fio", "--output-format=json", "--group_reporting", *options],
                                        capture_output=True, text=True, check=True, timeout=timeout))
    # fio may print notices before its JSON
    return t, json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]


def fio_rate(side: dict) -> float | None:
    """Bytes per second of a fio job's ``read`` or ``write`` side over its runtime."""
    return side["io_bytes"] / (side["runtime"] / 1000) if side["runtime"] else None


def last_json(text: str) -> dict:
    """The JSON object a peer process printed as its last line."""
    return json.loads(text.strip().splitlines()[-1])


def run_json(args: list[str], what: str, timeout: float = 900, **kw) -> dict:
    """Run a peer process that prints one JSON line last; that line, or RuntimeError with its stderr."""
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {p.returncode}): {p.stderr[-2000:]}")
    return last_json(p.stdout)


def bench_venv(venv: Path, *packages: str) -> str:
    """The Python of a benchmark-only venv (torch and peers never go into the project's venv), made
    with ``pip install PACKAGES`` on first use."""
    py = venv / "bin" / "python"
    if not py.exists():
        print(f"creating the benchmark venv {venv} ({' '.join(packages)})", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *packages], check=True)
    return str(py)


def iobench_exe() -> str:
    """The ``iobench`` console script beside the interpreter that runs the benchmark."""
    return str(Path(sys.executable).parent / "iobench")


def iobench_json(args: list[str], timeout: float = 900, throttle=None, **kw) -> tuple[dict, dict]:
    """``iobench ARGS --json OUT`` (inside ``throttle``, a ReadThrottle, when given): the results file, and
    the run (``command`` as the reports print it, ``seconds``, ``stdout``, ``stderr``).  Exit 1 is an
    answer (a target missed); any other failure raises with the command's stderr."""
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    cmd = [iobench_exe(), *args, "--json", str(out)]
    try:
        with throttle or nullcontext():
            seconds, p = timed(lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw))
        if p.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-3000:]}")
        doc = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    return doc, {"command": " ".join(cmd[1:]).replace(str(out), "OUT.json"), "seconds": seconds,
                 "stdout": p.stdout, "stderr": p.stderr}


def dataset(url: str | Path, samples: float, shard: str, fmt: str = "raw", modality: str = "tokens",
            seq_len: int = 512, vocab_size: int = 32000, fsync: bool = False, gen: dict | None = None, **spec):
    """``iobench gen`` of one dataset (GenSpec fields as keywords; ``gen``: generate()'s own, e.g. the
    endpoint): (its manifest, each shard's path: local, or bucket/key for an object store)."""
    from iobench.generate import GenSpec, generate

    m = generate(GenSpec(format=fmt, modality=modality, num_samples=int(samples), shard_size=shard, seq_len=seq_len,
                         vocab_size=vocab_size, fsync=fsync, **spec), str(url), progress=False, **(gen or {}))
    root = str(url).split("://", 1)[-1]
    return m, [f"{root}/{s.path}" for s in m.shards]


def fixed_records(m):
    """(offset of the first record, record bytes, dtype) of a dataset's fixed-size records (raw tokens)."""
    from iobench.formats import get_format

    return get_format(m.format).reader(m).fixed_records(m.shards[0])


def read_throttle(path: str | Path, bytes_per_s: int, tag: str):
    """A kernel cap on reads of the disk under ``path`` (``iobench.throttle.ReadThrottle``: a cgroup,
    entered per measured block), and "", or None and why this host cannot have one."""
    from iobench.blockdev import device_of
    from iobench.throttle import ReadThrottle, available

    ok, why = available()
    dev = device_of(str(path))
    if not ok or dev is None:
        return None, why if not ok else f"{path} is not on a block device"
    return ReadThrottle(dev, bytes_per_s, tag=tag), ""


@contextmanager
def stopwatch(into: dict, key: str) -> Iterator[None]:
    """Adds the seconds the block took to ``into[key]``."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[key] = time.perf_counter() - t0


def set_cache(files: list[str], state: str) -> float:
    """Warm (read every file) or cold (drop its pages); returns the largest resident fraction left."""
    from iobench.io.pagecache import drop_pages, file_residency, warm_file

    for f in files:
        (warm_file if state == "warm" else drop_pages)(f)
    res = [file_residency(f) for f in files]
    return max((r for r in res if r is not None), default=0.0)


# ------------------------------------------------------------------ Markdown

def table(head: list[str], rows: list[list], align: str = "---") -> list[str]:
    """A Markdown table's lines (``align``: the rule under every column but the first, e.g. ``---:``)."""
    return ["| " + " | ".join(head) + " |", "|---|" + "|".join([align] * (len(head) - 1)) + "|",
            *("| " + " | ".join(str(c) for c in r) + " |" for r in rows)]


def yes_no(met: bool | None) -> str:
    return "yes" if met else "no" if met is not None else "—"


def pct(x) -> str:
    """A fraction as a percentage with one decimal, or "-" for a missing value."""
    return "-" if x is None else f"{100 * x:.1f}%"


def num(x, fmt: str = ".2f") -> str:
    """``x`` formatted, or a dash for a missing value."""
    return "—" if x is None else format(x, fmt)


def header(title: str, meta: dict) -> list[str]:
    """A report's opening: the title, the command, the machine with its load average and the run's
    seconds (``meta``: ``command``, ``machine()``'s dict, ``seconds``)."""
    m = meta["machine"]
    return [f"# {title}", "", f"Command: `{meta['command']}`  ",
            f"Machine: {machine_line(m)}; {m['note']} (load average at start {m['load_avg_at_start'][0]:.1f}).  ",
            f"Run took {meta['seconds']:.0f} s.", ""]


def run_line(meta: dict, at: str = "") -> str:
    """'`COMMAND` — STARTED, N s; 2 cores, load average 1.0, 2.0, 3.0' from ``run_meta``."""
    return (f"`{meta['command']}` — {meta['started']}, {meta['seconds']:.0f} s; {meta['machine']['cpu_count']} cores, "
            f"load average {loadavg(meta['machine'])}{at}.")


def updates(meta: dict, tail: str = "Those rows come from the rerun; the rest from the run above.") -> list[str]:
    """A paragraph per ``--merge`` rerun recorded under ``meta['updates']``."""
    return [x for u in meta.get("updates", []) for x in (
        f"Rerun with `{u['command']}` ({u['machine']['cpu_count']} cores, {u['machine']['note']}; load average at "
        f"start {u['machine']['load_avg_at_start'][0]:.1f}, {u['seconds']:.0f} s): " + "; ".join(u["sections"])
        + ". " + tail, "")]


def row_notes(results: list[dict]) -> list[str]:
    return ["Notes:", ""] + [f"- {r['section']}: {r['note']}" for r in results if r.get("note")]


# ------------------------------------------------------------------ the script around the sections

def parser(doc: str | None, out: str, scratch_flag: str | None = "--work", raw: bool = False,
           where: str | None = None) -> argparse.ArgumentParser:
    """The options every benchmark has: ``--out`` (where the report goes) and a scratch directory
    (``where`` by default: a benchmark that throttles a disk needs one on a real disk, not tmpfs)."""
    ap = argparse.ArgumentParser(description=doc if raw else (doc or "").strip().split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter)
    ap.add_argument("--out", default=out, help=f"where the report goes (default {out})")
    if scratch_flag:
        ap.add_argument(scratch_flag, default=where, help="scratch directory on the file system to measure "
                                                          f"(default: {where or 'a temp dir'})")
    return ap


def refuse(field: str, problem: str, fix: str) -> int:
    """Bad input, before any work: one line naming the option and the fix, exit 2."""
    print(f"error: {field}: {problem}; {fix}", file=sys.stderr)
    return 2


def command(script: str, argv: list[str] | None = None) -> str:
    """How this run was started, as the reports print it."""
    return " ".join(["python", f"benchmarks/{script}", *(sys.argv[1:] if argv is None else argv)])


def run_meta(script: str, argv: list[str] | None, started: float, **extra) -> dict:
    """A report's ``meta``: how the run was started, the machine, when (UTC) and for how long
    (``started``: its ``time.time()``), and the benchmark's own facts."""
    return {"command": command(script, argv), "machine": machine(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "seconds": time.time() - started,
            **extra}


@contextmanager
def scratch(name: str, where: str | None = None) -> Iterator[Path]:
    """A temp directory (under ``where``) for one run, removed afterwards whatever happens."""
    d = Path(tempfile.mkdtemp(prefix=f"iobench-bench-{name}-", dir=where))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def write_report(out: str | Path, data: dict, markdown: str, rows: list[dict] | None = None, *,
                 command: str = "", indent: int = 1, echo: bool = True) -> None:
    """OUT.json (``data``), OUT.md (``markdown``) and, with ``rows``, OUT.rows.json for summary.py."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=indent, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown)
    if rows is not None:
        from summary import write_rows   # summary imports this module: imported here, not at the top

        write_rows(out.name, rows, ref=out.parent, command=command)
    if echo:
        print(markdown)


def sections_option(ap: argparse.ArgumentParser, names, merge: bool = True) -> None:
    """``--sections`` (a comma-separated subset of ``names``) and, with ``merge``, ``--merge``."""
    def chosen(text: str) -> str:
        bad = [x for x in (x.strip() for x in text.split(",")) if x and x not in names]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {','.join(names)}")
        return text
    ap.add_argument("--sections", type=chosen, default=",".join(names), help=f"comma-separated, of: {','.join(names)}")
    if merge:
        ap.add_argument("--merge", action="store_true",
                        help="replace only these sections' rows in an existing OUT.json/OUT.md, keep the rest")


def run_sections(sections: dict[str, Callable[..., list[dict]]], chosen: str, *args) -> list[dict]:
    """Each chosen section's rows, tagged with its key (``bench_section``, what ``--merge`` replaces)
    and its seconds; a line per row as it comes."""
    out: list[dict] = []
    for s in (x.strip() for x in chosen.split(",") if x.strip()):
        ts = time.perf_counter()
        rows = sections[s](*args)
        for r in rows:
            r["section_seconds"] = time.perf_counter() - ts
            r["bench_section"] = s
            print(f"[{s}] {r.get('section')}: ratio {r.get('ratio')} (target {r.get('target')}) met={r.get('met')}",
                  flush=True)
        out.extend(rows)
    return out


def write_results(out: str | Path, meta: dict, results: list[dict], merge: bool,
                  markdown: Callable[[list[dict], dict], str], rows: str | None = None,
                  legacy_prefix: dict | None = None) -> int:
    """OUT.json ``{"meta", "results"}``, OUT.md and (``rows``: the summary's DERIVE key) OUT.rows.json
    from a run's section rows; with ``merge``, they replace only the sections the run measured."""
    from summary import DERIVE, merge_results

    out = Path(out)
    if merge and out.with_suffix(".json").exists():
        meta, results = merge_results(json.loads(out.with_suffix(".json").read_text()), meta, results, legacy_prefix)
    write_report(out, {"meta": meta, "results": results}, markdown(results, meta),
                 DERIVE[rows]({"results": results}) if rows else None, command=meta["command"])
    return 0

