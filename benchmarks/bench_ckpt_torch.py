"""Checkpoints: iobench's engine vs the tools people use, on the same tensors, in one run.

    .venv-bench/bin/python benchmarks/bench_ckpt_torch.py [--mib 64,256] [--rounds 3] [--out reports/reference/ckpt_torch]

torch is a benchmark-only dependency, never in the project's venv: run from an interpreter
without torch, the script makes ``benchmarks/.venv-ckpt`` (git-ignored; iobench editable plus
``torch==2.13.0``) on first use and re-runs itself there.

For each state size, in alternating rounds on the same bytes (the torch tensors are views of
iobench's live state arrays, so both sides save identical memory):

- **blocking pause**: what the training step waits for.  iobench: ``Checkpointer.save`` in
  async mode (snapshot into reused staging; the write and fsync run in the background).
  ``torch.save``: the whole save.  DCP ``async_save``: until it returns (its staging copy).
- **time to durable**: from the call until the bytes are fsynced.  iobench: the save's
  commit latency (files and directory fsynced, manifest published).  ``torch.save`` + fsync
  of the file and its directory.  DCP ``async_save``: until its future resolves
  (``FileSystemWriter`` fsyncs each file, ``sync_files=True``).
- **restore**, page cache dropped first on both sides, each restore timed inside a fresh
  process (as after a job restart; see ``restore_child``): iobench ``restore`` (checksums
  verified) vs DCP ``load`` into preallocated tensors, and ``torch.load``.  Each restore
  also records the bytes it read from the device and its page faults (the JSON's
  ``restore_counters``): the proof that it was cold and what its memory cost.

Ratios are peer time / iobench time (above 1: iobench is faster), median of per-round ratios.
Writes OUT.json, OUT.md and OUT.rows.json (benchmarks/summary.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import command, machine, parser, ratios, scratch, write_report  # benchmarks/ is not a package

MiB = 2**20
TARGETS = {  # peer time / iobench time
    "blocking pause vs DCP async_save": 1.0,
    "blocking pause vs torch.save": 1.0,
    "time to durable vs torch.save + fsync": 0.8,
    "time to durable vs DCP async_save": 0.8,
    "restore (cold) vs DCP load": 1.0,
    "restore (cold) vs torch.load": 1.0,
}


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _io_counters() -> tuple[int, int, int]:
    """(bytes this process read from the device, minor faults, major faults) so far: the ground
    truth that a "cold" restore really read from the disk, and what its buffers cost in faults."""
    import resource

    read = 0
    try:
        with open("/proc/self/io") as f:
            read = next(int(ln.split()[1]) for ln in f if ln.startswith("read_bytes:"))
    except (OSError, StopIteration):
        read = -1
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return read, ru.ru_minflt, ru.ru_majflt


def _digest(a) -> str:
    import numpy as np
    import xxhash

    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(a).view("uint8"))


def restore_child(job: dict) -> dict:
    """One cold restore, timed inside a fresh interpreter: what a restarted job does.

    In the long-lived benchmark process, torch.load's tensors landed on memory that earlier
    sides had faulted in and freed (0 minor faults for 256 MiB), while iobench's one large
    buffer is always a fresh mapping; a restarted job has no such memory, and a fresh process
    (torch.load: 65.5k minor faults for 256 MiB, one per 4 KiB page) gives both sides the same
    start.  Before the timed restore, the child restores a tiny checkpoint of the same kind
    (``job["warm"]``, untimed), so that imports and first-call setup are not counted on any
    side; neither is the preallocation of DCP's destination."""
    side, d, warm = job["side"], Path(job["dir"]), Path(job["warm"])
    if side == "iobench":
        from iobench.checkpointing.restore import restore
        from iobench.storage import open_backend

        restore([("local", open_backend(str(warm / "iobench")))], cold=False, verify=True)
        backend = open_backend(str(d))
        c0 = _io_counters()
        res = restore([("local", backend)], cold=True, verify=True)
        c1 = _io_counters()
        out = {"seconds": res.seconds, "step": res.step, "bytes": res.bytes_read}
    else:
        import torch

        if side == "torch":
            torch.load(str(warm / "torch" / "state.pt"), weights_only=True)
            c0 = _io_counters()
            t0 = time.perf_counter()
            loaded = torch.load(str(d / "state.pt"), weights_only=True)
            seconds = time.perf_counter() - t0
            c1 = _io_counters()
        else:
            import torch.distributed.checkpoint as dcp

            dcp.load({"t0": torch.empty(4096, dtype=torch.uint8)}, checkpoint_id=str(warm / "dcp"))
            loaded = {f"t{i}": torch.empty(n, dtype=torch.uint8) for i, n in enumerate(job["sizes"])}
            c0 = _io_counters()
            t0 = time.perf_counter()
            dcp.load(loaded, checkpoint_id=str(d / "dcp"))
            seconds = time.perf_counter() - t0
            c1 = _io_counters()
        out = {"seconds": seconds, "bytes": sum(t.numel() for t in loaded.values()),
               "t0": _digest(loaded["t0"].numpy())}
    out["counters"] = {"device_read_bytes": c1[0] - c0[0], "minor_faults": c1[1] - c0[1],
                       "major_faults": c1[2] - c0[2]}
    return out


def _restore_in_child(job: dict) -> dict:
    import subprocess

    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--restore-child", json.dumps(job)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"restore child ({job['side']}) failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _drop_tree(root: Path) -> None:
    from iobench.io.pagecache import drop_pages

    for p in root.rglob("*"):
        if p.is_file():
            drop_pages(str(p))


def one_size(mib: int, rounds: int, work: Path) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    from iobench.checkpointing.commit import Checkpointer, EngineConfig
    from iobench.checkpointing.snapshot import LiveState
    from iobench.checkpointing.state import from_params
    from iobench.storage import open_backend

    spec = from_params(-(-mib * MiB // 14))      # bf16-mixed-adam: 14 bytes per parameter, one rank
    live = LiveState(spec, [0])
    live.fill(0, 1)
    arrays = live.arrays[0]
    sd = {f"t{i}": torch.from_numpy(a.view("uint8").reshape(-1)) for i, a in enumerate(arrays)}
    nbytes = sum(t.numel() for t in sd.values())
    sizes = [t.numel() for t in sd.values()]
    times: dict[str, list[float]] = {k: [] for k in (
        "iobench_blocking", "iobench_durable", "torch_save", "torch_save_durable", "dcp_blocking", "dcp_durable",
        "iobench_restore", "dcp_load", "torch_load")}
    # per restore side and round: device bytes read, minor and major faults (see _io_counters)
    counters: dict[str, list[dict]] = {k: [] for k in ("iobench_restore", "dcp_load", "torch_load")}
    # One engine for the whole run, as a training job keeps one: its staging buffers are reused.
    ours = open_backend(str(work / f"iobench-{mib}"))
    ck = Checkpointer(spec, [0], ours, None, EngineConfig(mode="async", keep_local=1))
    times_all = times
    # tiny checkpoints of each kind, for the restore children's untimed warm-up (see restore_child)
    warm = work / f"warm-{mib}"
    tiny = from_params(4096)
    tiny_live = LiveState(tiny, [0])
    tiny_live.fill(0, 1)
    with Checkpointer(tiny, [0], open_backend(str(warm / "iobench")), None, EngineConfig(mode="sync")) as tck:
        tck.save(1, tiny_live)
    (warm / "torch").mkdir(parents=True)
    torch.save({"t0": torch.zeros(4096, dtype=torch.uint8)}, str(warm / "torch" / "state.pt"))
    dcp.save({"t0": torch.zeros(4096, dtype=torch.uint8)}, checkpoint_id=str(warm / "dcp"))
    for r in range(-1, rounds):   # round -1 warms every side up (imports, thread pools, first faults)
        times = {k: [] for k in times_all} if r < 0 else times_all
        count = {k: [] for k in counters} if r < 0 else counters
        sides = ["iobench", "torch", "dcp"]
        order = sides[r % 3:] + sides[:r % 3]   # rotate who goes first
        live.touch(r + 2)   # the same state for all three sides this round, changed from the last
        t0_digest = _digest(arrays[0])   # what a peer's restored t0 must hash to this round
        for side in order:
            d = work / f"{side}-{r}"
            if side == "iobench":
                rec = ck.save(r + 2, live)
                ck.wait()
                times["iobench_blocking"].append(rec.blocking_s)
                times["iobench_durable"].append(rec.commit_latency_s)
                continue
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            if side == "torch":
                path = str(d / "state.pt")
                t0 = time.perf_counter()
                torch.save(sd, path)
                t1 = time.perf_counter()
                _fsync_path(path)
                _fsync_path(str(d))
                t2 = time.perf_counter()
                times["torch_save"].append(t1 - t0)
                times["torch_save_durable"].append(t2 - t0)
            else:
                t0 = time.perf_counter()
                fut = dcp.async_save(sd, checkpoint_id=str(d / "dcp"))
                t1 = time.perf_counter()
                fut.result()
                t2 = time.perf_counter()
                times["dcp_blocking"].append(t1 - t0)
                times["dcp_durable"].append(t2 - t0)
        # restore, cold, alternating order; each side reads what it wrote this round, in a fresh process
        for side in order:
            d = work / f"{side}-{r}" if side != "iobench" else work / f"iobench-{mib}"
            _drop_tree(d)
            key = {"iobench": "iobench_restore", "torch": "torch_load", "dcp": "dcp_load"}[side]
            got = _restore_in_child({"side": side, "dir": str(d), "sizes": sizes, "warm": str(warm)})
            if side == "iobench":
                assert got["step"] == r + 2, got
                assert got["bytes"] >= nbytes, got
            else:
                assert got["bytes"] == nbytes and got["t0"] == t0_digest, got
            times[key].append(got["seconds"])
            count[key].append(got["counters"])
        for side in ("torch", "dcp"):
            shutil.rmtree(work / f"{side}-{r}", ignore_errors=True)
    ck.close()
    times = times_all

    def ratio(peer: str, ours: str) -> dict:
        r = ratios(times[peer], times[ours])
        return {"per_round": r["per_round"], "median": r["median"]}
    pairs = {"blocking pause vs DCP async_save": ("dcp_blocking", "iobench_blocking"),
             "blocking pause vs torch.save": ("torch_save", "iobench_blocking"),
             "time to durable vs torch.save + fsync": ("torch_save_durable", "iobench_durable"),
             "time to durable vs DCP async_save": ("dcp_durable", "iobench_durable"),
             "restore (cold) vs DCP load": ("dcp_load", "iobench_restore"),
             "restore (cold) vs torch.load": ("torch_load", "iobench_restore")}
    return {"mib": mib, "bytes": nbytes, "tensors": len(sd), "times_s": times, "restore_counters": counters,
            "medians_s": {k: statistics.median(v) for k, v in times.items()},
            "ratios": {k: {**ratio(*v), "peer": v[0], "iobench": v[1], "target": TARGETS[k]} for k, v in pairs.items()}}


def rows(res: dict) -> list[dict]:
    out = []
    for s in res["sizes"]:
        for k, r in s["ratios"].items():
            m = r["median"]
            out.append({"comparison": f"ckpt {s['mib']} MiB: {k} (peer time / iobench time)", "ratio": m,
                        "target": r["target"], "direction": ">=", "met": m is not None and m >= r["target"],
                        "detail": f"{r['peer']} / {r['iobench']}"})
    return out


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = ["# Checkpoints: iobench vs torch.save and torch.distributed.checkpoint", "",
             f"Command: `{res['command']}` at {res['started_at']}.  ",
             f"Machine: {m['cpu_count']} cores, {m['memory_bytes'] / 2**30:.0f} GiB, {m['os']}, Python "
             f"{m['python']}, torch {res['torch']}; shared with other work (load average at start "
             f"{m['load_avg_at_start'][0]:.1f}, at the end {res['load_avg_end'][0]:.1f}).  ",
             f"{res['rounds']} alternating rounds per size (the order rotates); ratio = peer time / iobench time, "
             "median of the per-round ratios (above 1: iobench is faster).", "",
             "| state | comparison | iobench | peer | ratio | target | met |", "|---|---|---|---|---|---|---|"]
    for s in res["sizes"]:
        med = s["medians_s"]
        for k, r in s["ratios"].items():
            ratio = f"{r['median']:.2f}" if r["median"] is not None else "—"
            met = "yes" if r["median"] is not None and r["median"] >= r["target"] else "**no**"
            lines.append(f"| {s['mib']} MiB | {k} | {med[r['iobench']] * 1e3:,.0f} ms | "
                         f"{med[r['peer']] * 1e3:,.0f} ms | {ratio} | >= {r['target']:g} | {met} |")
    lines += ["", "Restore counters (median per round; the device bytes prove each read was cold):", "",
              "| state | side | read from device | minor faults | major faults |", "|---|---|---|---|---|"]
    for s in res["sizes"]:
        for side, cs in s.get("restore_counters", {}).items():
            if cs:
                med = {k: statistics.median(c[k] for c in cs) for k in cs[0]}
                lines.append(f"| {s['mib']} MiB | {side} | {med['device_read_bytes'] / 2**20:,.0f} MiB | "
                             f"{med['minor_faults']:,.0f} | {med['major_faults']:,.0f} |")
    lines += ["", "What each side does:", "",
              "- iobench: `Checkpointer(mode=async)` with a local tier only; blocking = snapshot into reused "
              "staging buffers; durable = rank file written and fsynced, directory fsynced, manifest published "
              "(the commit point); the rank file goes out in 8 MiB chunks, each hashed (xxh3_64) just before its "
              "write, with its writeback started at once (`sync_file_range`), so the disk works while the next "
              "chunk is copied and the fsync waits for less. Restore = newest committed checkpoint, page cache "
              "dropped, the rank file read into a fresh buffer in 16 MiB `preadv`s, each chunk hashed (xxh3_64) on a "
              "helper thread while the next is read, then verified.",
              "- Every restore (all three sides) runs and is timed in a fresh process, as after a job restart; "
              "imports and DCP's destination tensors are not timed. In the long-lived benchmark process "
              "torch.load's tensors had landed on memory that earlier sides had faulted in and freed (0 minor "
              "faults for 256 MiB, against 65.5k — one per 4 KiB page — in a fresh process), while iobench's "
              "one large buffer is always a fresh mapping.",
              "- torch.save: pickled state dict of the same tensors (views of iobench's arrays), then fsync of the "
              "file and the directory (torch.save itself does not fsync).",
              "- DCP: `torch.distributed.checkpoint.async_save` without a process group (one rank), "
              "FileSystemWriter defaults (sync_files=True); blocking = until async_save returns (its CPU staging "
              "copy), durable = until the future resolves. Load = `dcp.load` into preallocated tensors.",
              "", "Per-round times are in the JSON beside this file."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = parser(__doc__, "reports/reference/ckpt_torch")
    ap.add_argument("--mib", default="64,256", help="state sizes in MiB, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--restore-child", default=None, help=argparse.SUPPRESS)   # internal: one timed restore
    args = ap.parse_args(argv)
    if args.restore_child:
        warnings.filterwarnings("ignore")
        print(json.dumps(restore_child(json.loads(args.restore_child))), flush=True)
        return 0
    try:
        import torch
    except ImportError:
        venv = Path(__file__).resolve().parent / ".venv-ckpt"
        py = venv / "bin" / "python"
        if not py.exists():
            import subprocess

            print(f"creating the benchmark venv {venv} (iobench + torch==2.13.0)", flush=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", "-e", str(Path(__file__).resolve().parents[1]),
                            "torch==2.13.0"], check=True)
        os.execv(str(py), [str(py), __file__, *(argv if argv is not None else sys.argv[1:])])
    warnings.filterwarnings("ignore")   # DCP warns that no process group is initialised: one rank is intended
    res = {"command": command("bench_ckpt_torch.py", argv), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": machine(), "torch": torch.__version__, "rounds": args.rounds, "sizes": []}
    with scratch("ckpt-torch", args.work) as work:
        for mib in (int(x) for x in args.mib.split(",") if x.strip()):
            res["sizes"].append(one_size(mib, args.rounds, work))
            print(json.dumps({k: v["median"] for k, v in res["sizes"][-1]["ratios"].items()}), flush=True)
    res["load_avg_end"] = list(os.getloadavg())
    write_report(args.out, res, markdown(res), rows(res), command=res["command"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
