"""Every benchmark ratio against its target, in one table.

    .venv/bin/python benchmarks/summary.py [--ref reports/reference] [--out reports/reference/summary.md]

Each benchmark writes its full results as ``reports/reference/NAME.json`` and, through
``write_rows(NAME, rows)``, a row set ``NAME.rows.json``: one row per peer comparison with
``comparison``, ``ratio`` (iobench / peer, higher is better unless ``direction`` is ``<=``),
``target`` and ``met``.  This script collects the row sets (deriving one from NAME.json
where a benchmark has not written its own yet), prints the table with the misses first,
and keeps the latest in ``summary.md`` with the machine, the load average and the date.
Exit status is 0 either way: a miss is information, not a failure of the run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
from pathlib import Path

from harness import machine, machine_line, met, table

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "reports" / "reference"


def summary_row(comparison: str, ratio, target, direction: str = ">=", detail: str = "") -> dict:
    """One row of the table: ``met`` is None without a ratio or a numeric target."""
    return {"comparison": comparison, "ratio": ratio, "target": target, "direction": direction,
            "met": None if ratio is None else met(ratio, target, direction), "detail": detail}


def _target(t) -> tuple[float | None, str]:
    """'>= 0.8' / '<= 1.2' / 0.7 -> (number, direction)."""
    if isinstance(t, (int, float)):
        return float(t), ">="
    m = re.match(r"(>=|<=)\s*([^\s;]*)", t.strip()) if isinstance(t, str) else None
    if m is None:
        return None, ">="
    try:
        return float(m[2]), m[1]
    except ValueError:
        return None, m[1]


# ------------------------------------------------------------------------------------------------
# How each benchmark's NAME.json turns into rows.  A benchmark that writes its own NAME.rows.json
# (write_rows) uses the same function, so the two never disagree.

def _rows_load(d: dict) -> list[dict]:
    out = []
    for r in d.get("results", []):
        if "skipped" in r or (r.get("ratio") is None and r.get("target") is None):
            continue   # skipped, or not a ratio row (e.g. fidelity's stall grids)
        t, direction = _target(r.get("target"))
        out.append(summary_row(r["section"], r.get("ratio"), t, direction, r.get("metric", "")))
    return out


def _rows_generate(d: dict) -> list[dict]:
    return [summary_row(f"gen {what}, {d[k].get('workers')} writers, vs {peer} (median)", d[k].get("ratio_median"), 0.8)
            for k, what, peer in (("tokens", "raw tokens", "fio write+fsync"), ("s3", "upload to S3", "s3fs put")) if d.get(k)]


def _rows_stage(d: dict) -> list[dict]:
    return [summary_row(f"stage {c['case']} vs {c.get('peer')}", c.get("ratio_median"), None if c.get("diagnostic") else 0.9)
            for c in d.get("cases", [])]   # a diagnostic row (bench_stage's copy loops alone) has no target


CKPT_ROWS = (  # section of ckpt.json, its row, the ratio's key, the target (else the section's own)
    ("snapshot_vs_memcpy", "ckpt snapshot (blocking) vs memcpy of the same state", "ratio_snapshot_over_memcpy", None),
    ("local_write_vs_fio", "ckpt local write+fsync vs fio write --end_fsync", "ratio_ours_over_fio", None),
    ("s3_commit_vs_put", "ckpt S3 commit time vs s3fs put time (lower is better)", "ratio_ours_over_put_time", "<= 1.2"))


def _rows_ckpt(d: dict) -> list[dict]:
    # the torch comparisons are bench_ckpt_torch's own row set (ckpt_torch.rows.json)
    return [summary_row(what, d[k].get(key), *_target(target or d[k].get("target"))) for k, what, key, target in CKPT_ROWS
            if d.get(k)]


def _rows_gds(d: dict) -> list[dict]:
    return [summary_row(f"gds cpu path, {r['cache']}, {r['io_size_bytes'] // 1024} KiB x {r['threads']} threads vs fio",
                 r.get("ratio"), None) for r in d.get("rows", [])]


def _rows_probe(d: dict) -> list[dict]:
    return [summary_row(f"probe engine: {r['job']} vs fio (IOPS)", r.get("ratio_iops"), None) for r in d.get("rows", [])]


def _rows_mpi(d: dict) -> list[dict]:
    o, b = d.get("overhead"), d.get("barrier")
    out = [summary_row("mpi: barrier+gather+merge share of a 10 s load on 3 ranks", o.get("overhead_ratio"), 0.01,
                       "<=", "transfer_and_merge_s / wall_s")] if o else []
    if b:
        out.append(summary_row("mpi: bounded barrier (Ibarrier+Test) vs MPI_Barrier, time per call",
                               b.get("ratio_bounded_to_native"), None, "<="))
    return out + [summary_row(f"mpi: load world samples/s, {n} ranks vs 1 process (same work, 2 cores)",
                              v.get("ratio_to_1_rank_median"), None)
                  for n, v in ((d.get("load") or {}).get("per_world") or {}).items() if str(n) != "1"]


def _rows_dlio(d: dict) -> list[dict]:
    """bench_dlio (issue 28's Done-when): iobench within 5% / 3 pp of the bandwidth truth, and at least
    as close to it as DLIO on the same shape (error ratio <= 1)."""
    out = []
    by = {(r["shape"], r["mode"], r["tool"]): r for r in d.get("rows", [])}
    for (shape, mode, tool), r in by.items():
        if r.get("model_au") is not None and r.get("au") is not None:
            # diagnostic: the steady-state truth ignores a short epoch's fill and drain, which an ideal
            # loader has too; bench_dlio's epoch model replays one (its docstring says how)
            out.append(summary_row(f"dlio: {shape} {mode} {tool} AU minus the ideal-loader epoch model (pp)",
                                   100 * (r["au"] - r["model_au"]), None, "<=",
                                   "not a ratio: signed percentage points"))
        if tool != "iobench" or r.get("truth_samples_per_s") is None or r.get("samples_per_s") is None:
            continue
        out.append(summary_row(f"dlio: {shape} {mode} iobench samples/s vs the bandwidth truth",
                        r["samples_per_s"] / r["truth_samples_per_s"], 0.95))
        out.append(summary_row(f"dlio: {shape} {mode} iobench AU off the truth, absolute pp (lower is better)",
                        abs(r["au_pp"]), 3.0, "<=", "not a ratio: percentage points"))
        peer = by.get((shape, mode, "dlio"))
        if peer and peer.get("samples_rel") is not None and peer.get("au_pp") is not None:
            # a DLIO error under the table's resolution (0.1% / 0.1 pp) counts as that resolution
            for what, mine, theirs, floor in (("samples/s", r["samples_rel"], peer["samples_rel"], 0.001),
                                              ("AU", r["au_pp"], peer["au_pp"], 0.1)):
                out.append(summary_row(f"dlio: {shape} {mode} iobench's {what} error vs DLIO's, against the truth "
                                "(lower is better)", abs(mine) / max(abs(theirs), floor), 1.0, "<=",
                                "abs(iobench - truth) / abs(DLIO - truth)"))
    return out


DERIVE = {"dlio": _rows_dlio, "mpi": _rows_mpi, "load": _rows_load, "generate": _rows_generate, "stage": _rows_stage, "ckpt": _rows_ckpt,
          "gds_cpu_vs_fio": _rows_gds, "probe_engines": _rows_probe, "fidelity": _rows_load}


def write_rows(name: str, rows: list[dict], ref: Path = REF, command: str = "") -> Path:
    """Write ``NAME.rows.json`` beside NAME.json."""
    path = ref / f"{name}.rows.json"
    path.write_text(json.dumps({"benchmark": name, "written_at": _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), "command": command or " ".join(sys.argv), "machine": machine(), "rows": rows},
        indent=1) + "\n")
    return path


def merge_results(old: dict, meta: dict, results: list[dict],
                  legacy_prefix: dict | None = None) -> tuple[dict, list[dict]]:
    """A benchmark's ``--merge``: old results with this run's rows in place of the rows it reran
    (matched by section name; rows that carry ``bench_section`` also replace every old row of that
    section, and ``legacy_prefix`` maps a section to how its rows began before they carried one).
    ``meta['updates']`` gains this run; earlier updates no longer own the rows it replaced."""
    new = {r["section"]: r for r in results}
    # A rerun section owns all of its old rows, also those whose label has changed since.
    rerun_keys = {r.get("bench_section") for r in results}
    legacy = tuple((legacy_prefix or {})[k] for k in rerun_keys if k in (legacy_prefix or {}))
    kept = [r for r in old["results"] if r.get("bench_section", "") not in rerun_keys
            and not (not r.get("bench_section") and legacy and r["section"].startswith(legacy))]
    merged = [new.pop(r["section"], r) for r in kept]
    merged += list(new.values())
    for r in results:
        r["rerun"] = meta["command"]
    old_meta = dict(old["meta"])
    rerun = {r["section"] for r in results}
    # An earlier update no longer owns the rows this run replaced.
    earlier = [{**u, "sections": [x for x in u.get("sections", []) if x not in rerun]}
               for u in old_meta.get("updates", [])]
    old_meta["updates"] = [u for u in earlier if u["sections"]] + [{**meta, "sections": sorted(rerun)}]
    return old_meta, merged


def _measured_at(full: Path) -> _dt.datetime:
    """When NAME.json was measured: its own date field, else its last commit, else the file's mtime."""
    import subprocess

    d = json.loads(full.read_text())
    for k in ("started_at", "started", "date"):
        v = d.get(k) if isinstance(d, dict) else None
        if isinstance(v, str):
            try:
                t = _dt.datetime.fromisoformat(v.replace("Z", "+00:00"))
                return t if t.tzinfo else t.replace(tzinfo=_dt.timezone.utc)
            except ValueError:
                pass

    def git(*args: str) -> str:
        return subprocess.run(["git", *args, "--", str(full)], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    committed = "" if git("status", "--porcelain") else git("log", "-1", "--format=%cI")   # not changed since
    return (_dt.datetime.fromisoformat(committed) if committed
            else _dt.datetime.fromtimestamp(full.stat().st_mtime, _dt.timezone.utc))


def collect(ref: Path) -> list[dict]:
    """(benchmark, row) pairs from every row set, or derived from the full JSON where none is newer."""
    out = []
    for full in sorted(ref.glob("*.json")):
        if full.name.endswith(".rows.json"):
            continue
        name = full.stem
        rows_file = ref / f"{name}.rows.json"
        if rows_file.exists() and rows_file.stat().st_mtime >= full.stat().st_mtime:
            data = json.loads(rows_file.read_text())
            rows, when = data["rows"], _dt.datetime.fromisoformat(data["written_at"])
        elif name in DERIVE:
            try:
                rows, when = DERIVE[name](json.loads(full.read_text())), _measured_at(full)
            except (KeyError, TypeError, ValueError) as e:   # a report whose shape changed: say so, go on
                print(f"summary: {full.name}: rows not derived ({type(e).__name__}: {e}); "
                      f"let its benchmark call write_rows({name!r}, rows)", file=sys.stderr)
                continue
        else:
            continue   # not a peer comparison, or a benchmark that writes no row set yet
        for r in rows:
            out.append({"benchmark": name, "measured": when.strftime("%Y-%m-%d"), **r})
    return out


def render(rows: list[dict], meta: dict) -> str:
    def key(r):  # misses first, then rows without a target, then the met ones
        return (0 if r["met"] is False else 1 if r["met"] is None else 2, r["benchmark"])
    missed = sum(r["met"] is False for r in rows)
    met = sum(r["met"] is True for r in rows)
    m = meta["machine"]
    lines = ["# Every ratio against its target (latest reference runs)", "",
             f"**{missed} missed, {met} met, {len(rows) - missed - met} without a target** "
             f"(ratio = iobench / peer on the same bytes in the same run).", "",
             f"Collected {meta['date']} on {machine_line(m)}; load average "
             f"{' / '.join(f'{x:.1f}' for x in m['load_avg_at_start'])} (shared machine: absolute numbers are noise, "
             "ratios are what to compare). Each row's own machine and load average are in its benchmark's report.", ""]
    return "\n".join(lines + table(["benchmark", "comparison", "ratio", "target", "met", "measured"], [
        [r["benchmark"], r["comparison"], f"{r['ratio']:.2f}" if isinstance(r.get("ratio"), (int, float)) else "—",
         f"{r['direction']} {r['target']:g}" if isinstance(r.get("target"), (int, float)) else "—",
         {True: "yes", False: "**no**", None: "—"}[r["met"]], r["measured"]] for r in sorted(rows, key=key)])) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default=str(REF), help="directory of the benchmarks' JSON (reports/reference)")
    ap.add_argument("--out", default=None, help="Markdown summary (default: REF/summary.md)")
    args = ap.parse_args(argv)
    ref = Path(args.ref)
    rows = collect(ref)
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine()}
    md = render(rows, meta)
    Path(args.out or ref / "summary.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
