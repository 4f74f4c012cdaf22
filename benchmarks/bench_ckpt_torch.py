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
from harness import (MiB, bench_venv, command, machine, machine_line, notes, parser, ratios, run_json, scratch,
                     set_cache, table, timed, write_report)  # benchmarks/ is not a package
# comparison: (the peer's times, iobench's times, the target for peer time / iobench time)
PAIRS = {"blocking pause vs DCP async_save": ("dcp_blocking", "iobench_blocking", 1.0),
         "blocking pause vs torch.save": ("torch_save", "iobench_blocking", 1.0),
         "time to durable vs torch.save + fsync": ("torch_save_durable", "iobench_durable", 0.8),
         "time to durable vs DCP async_save": ("dcp_durable", "iobench_durable", 0.8),
         "restore (cold) vs DCP load": ("dcp_load", "iobench_restore", 1.0),
         "restore (cold) vs torch.load": ("torch_load", "iobench_restore", 1.0)}
RESTORES = {"iobench": "iobench_restore", "torch": "torch_load", "dcp": "dcp_load"}


def _io_counters() -> tuple[int, int, int]:
    """(bytes this process read from the device, minor faults, major faults) so far: the ground
    truth that a "cold" restore really read from the disk, and what its buffers cost in faults."""
    import resource

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

        def load():
            return restore([("local", backend)], cold=True, verify=True)
    elif side == "torch":
        import torch

        torch.load(str(warm / "torch" / "state.pt"), weights_only=True)

        def load():
            return torch.load(str(d / "state.pt"), weights_only=True)
    else:
        import torch
        import torch.distributed.checkpoint as dcp

        dcp.load({"t0": torch.empty(4096, dtype=torch.uint8)}, checkpoint_id=str(warm / "dcp"))
        loaded = {f"t{i}": torch.empty(n, dtype=torch.uint8) for i, n in enumerate(job["sizes"])}

        def load():
            dcp.load(loaded, checkpoint_id=str(d / "dcp"))
            return loaded
    c0 = _io_counters()
    seconds, got = timed(load)
    c1 = _io_counters()
    if side == "iobench":
        out = {"seconds": got.seconds, "step": got.step, "bytes": got.bytes_read}
    else:
        out = {"seconds": seconds, "bytes": sum(t.numel() for t in got.values()), "t0": _digest(got["t0"].numpy())}
    out["counters"] = {"device_read_bytes": c1[0] - c0[0], "minor_faults": c1[1] - c0[1],
                       "major_faults": c1[2] - c0[2]}
    return out


def one_size(mib: int, rounds: int, work: Path) -> dict:
    import torch
    import torch.distributed.checkpoint as dcp

    from bench_ckpt import one_rank_state

    from iobench.checkpointing.commit import Checkpointer, EngineConfig
    from iobench.io.atomic import fsync_dir
    from iobench.storage import open_backend

    live = one_rank_state(-(-mib * MiB // 14))      # bf16-mixed-adam: 14 bytes per parameter
    arrays = live.arrays[0]
    sd = {f"t{i}": torch.from_numpy(a.view("uint8").reshape(-1)) for i, a in enumerate(arrays)}
    sizes = [t.numel() for t in sd.values()]
    nbytes = sum(sizes)
    times: dict[str, list[float]] = {k: [] for peer, mine, _ in PAIRS.values() for k in (peer, mine)}
    # per restore side and round: device bytes read, minor and major faults (see _io_counters)
    counters: dict[str, list[dict]] = {k: [] for k in RESTORES.values()}
    # One engine for the whole run, as a training job keeps one: its staging buffers are reused.
    ck = Checkpointer(live.spec, [0], open_backend(str(work / f"iobench-{mib}")), None,
                      EngineConfig(mode="async", keep_local=1))
    # tiny checkpoints of each kind, for the restore children's untimed warm-up (see restore_child)
    warm = work / f"warm-{mib}"
    tiny_live = one_rank_state(4096)
    with Checkpointer(tiny_live.spec, [0], open_backend(str(warm / "iobench")), None, EngineConfig(mode="sync")) as tck:
        tck.save(1, tiny_live)
    (warm / "torch").mkdir(parents=True)
    torch.save({"t0": torch.zeros(4096, dtype=torch.uint8)}, str(warm / "torch" / "state.pt"))
    dcp.save({"t0": torch.zeros(4096, dtype=torch.uint8)}, checkpoint_id=str(warm / "dcp"))
    for r in range(-1, rounds):   # round -1 warms every side up (imports, thread pools, first faults)
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
            t0 = time.perf_counter()
            if side == "torch":
                torch.save(sd, str(d / "state.pt"))
                t1 = time.perf_counter()
                with open(d / "state.pt", "rb") as f:
                    os.fsync(f.fileno())
                fsync_dir(d)
            else:
                fut = dcp.async_save(sd, checkpoint_id=str(d / "dcp"))
                t1 = time.perf_counter()
                fut.result()
            t2 = time.perf_counter()
            blocking, durable = {"torch": ("torch_save", "torch_save_durable"), "dcp": ("dcp_blocking", "dcp_durable")}[side]
            times[blocking].append(t1 - t0)
            times[durable].append(t2 - t0)
        # restore, cold, alternating order; each side reads what it wrote this round, in a fresh process
        for side in order:
            d = work / f"{side}-{r}" if side != "iobench" else work / f"iobench-{mib}"
            set_cache([str(p) for p in d.rglob("*") if p.is_file()], "cold")
            got = run_json([sys.executable, str(Path(__file__).resolve()), "--restore-child", json.dumps(
                {"side": side, "dir": str(d), "sizes": sizes, "warm": str(warm)})], f"restore child ({side})")
            if side == "iobench":
                assert got["step"] == r + 2, got
                assert got["bytes"] >= nbytes, got
            else:
                assert got["bytes"] == nbytes and got["t0"] == t0_digest, got
            times[RESTORES[side]].append(got["seconds"])
            counters[RESTORES[side]].append(got["counters"])
        for side in ("torch", "dcp"):
            shutil.rmtree(work / f"{side}-{r}", ignore_errors=True)
        if r < 0:
            for v in (*times.values(), *counters.values()):
                v.clear()      # the warm-up round is not counted
    ck.close()

    def pair(peer: str, mine: str, target: float) -> dict:
        r = ratios(times[peer], times[mine])
        return {"per_round": r["per_round"], "median": r["median"], "peer": peer, "iobench": mine, "target": target}
    return {"mib": mib, "bytes": nbytes, "tensors": len(sd), "times_s": times, "restore_counters": counters,
            "medians_s": {k: statistics.median(v) for k, v in times.items()},
            "ratios": {k: pair(*v) for k, v in PAIRS.items()}}


def rows(res: dict) -> list[dict]:
    return [{"comparison": f"ckpt {s['mib']} MiB: {k} (peer time / iobench time)", "ratio": r["median"],
             "target": r["target"], "direction": ">=", "met": r["median"] is not None and r["median"] >= r["target"],
             "detail": f"{r['peer']} / {r['iobench']}"} for s in res["sizes"] for k, r in s["ratios"].items()]


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = ["# Checkpoints: iobench vs torch.save and torch.distributed.checkpoint", "",
             f"Command: `{res['command']}` at {res['started_at']}.  ",
             f"Machine: {machine_line(m)}, torch {res['torch']}; shared with other work (load average at start "
             f"{m['load_avg_at_start'][0]:.1f}, at the end {res['load_avg_end'][0]:.1f}).  ",
             f"{res['rounds']} alternating rounds per size (the order rotates); ratio = peer time / iobench time, "
             "median of the per-round ratios (above 1: iobench is faster).", ""]
    lines += table(["state", "comparison", "iobench", "peer", "ratio", "target", "met"],
                   [[f"{s['mib']} MiB", k, f"{s['medians_s'][r['iobench']] * 1e3:,.0f} ms",
                     f"{s['medians_s'][r['peer']] * 1e3:,.0f} ms", "—" if r["median"] is None else f"{r['median']:.2f}",
                     f">= {r['target']:g}", "yes" if r["median"] is not None and r["median"] >= r["target"] else "**no**"]
                    for s in res["sizes"] for k, r in s["ratios"].items()])
    lines += ["", "Restore counters (median per round; the device bytes prove each read was cold):", ""]
    counts = [(s["mib"], side, {k: statistics.median(c[k] for c in cs) for k in cs[0]})
              for s in res["sizes"] for side, cs in s.get("restore_counters", {}).items() if cs]
    lines += table(["state", "side", "read from device", "minor faults", "major faults"],
                   [[f"{mib} MiB", side, f"{c['device_read_bytes'] / 2**20:,.0f} MiB", f"{c['minor_faults']:,.0f}",
                     f"{c['major_faults']:,.0f}"] for mib, side, c in counts])
    lines += ["", "What each side does:", "", notes("ckpt_torch"),
              "", "Per-round times are in the JSON beside this file."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = parser(__doc__, "reports/reference/ckpt_torch")
    ap.add_argument("--mib", default="64,256", help="state sizes in MiB, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--restore-child", default=None, help=argparse.SUPPRESS)   # internal: one timed restore
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")   # DCP warns that no process group is initialised: one rank is intended
    if args.restore_child:
        print(json.dumps(restore_child(json.loads(args.restore_child))), flush=True)
        return 0
    try:
        import torch
    except ImportError:
        here = Path(__file__).resolve().parent
        py = bench_venv(here / ".venv-ckpt", "-e", str(here.parent), "torch==2.13.0")   # iobench editable + torch
        os.execv(py, [py, __file__, *(argv if argv is not None else sys.argv[1:])])
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
