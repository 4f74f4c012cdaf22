"""Dataset generation vs the peers, in one run, on the same bytes and the same file system.

1. raw tokens: ``iobench gen`` (N writer processes, fsync per shard) vs ``fio`` sequential write of
   the same total size with ``--end_fsync=1``; ratio = iobench / fio throughput (target >= 0.8).
   Peak RSS of all generator processes is sampled during the run, at two dataset sizes, to show
   memory does not grow with the dataset.
2. tar images: samples/s with 1 and N writers, and where the time goes (image synthesis, JPEG
   encoding, tar framing + checksums + I/O), each part timed on the same samples.
3. S3 (embedded SeaweedFS, started here): ``iobench gen`` straight to s3:// vs a plain s3fs
   ``put`` of the same shard files already on local disk.

Rounds alternate peer and iobench; ratios are medians.  Writes reports/reference/generate.md
and generate.json.

    .venv/bin/python benchmarks/bench_generate.py [--size 1GiB] [--images 400] [--s3-size 256MiB]
        [--workers N] [--rounds 2] [--dir DIR] [--out reports/reference]
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from itertools import count
from pathlib import Path

import psutil

from iobench.generate import GenSpec, generate, make_synth
from iobench.results import now_iso
from iobench.units import format_bytes, parse_size

import harness
from harness import REF, alternating, cpu_seconds, fio, median, table, timed

def _rss(p: psutil.Process) -> int | None:
    try:
        return p.memory_info().rss
    except psutil.Error:   # exited between the listing and the read
        return None


@contextmanager
def peak_rss(exclude: set[int]) -> Iterator[dict]:
    """Samples the summed RSS of this process and its children (minus excluded pids) every 20 ms:
    ``{"bytes", "processes"}`` at the peak."""
    peak = {"bytes": 0, "processes": 0}
    stop = threading.Event()

    def sample() -> None:
        me = psutil.Process()
        while not stop.is_set():
            rss = [r for p in [me, *me.children(recursive=True)] if p.pid not in exclude and (r := _rss(p)) is not None]
            if sum(rss) > peak["bytes"]:
                peak.update(bytes=sum(rss), processes=len(rss))
            stop.wait(0.02)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield peak
    finally:
        stop.set()
        t.join()


def run_fio(path: Path, size: int) -> dict:
    c0 = cpu_seconds()
    wall, job = fio("--name=seqwrite", f"--filename={path}", "--rw=write", "--bs=1M", f"--size={size}", "--ioengine=psync",
                    "--end_fsync=1")
    job = job["write"]
    path.unlink(missing_ok=True)
    # fio's own bandwidth can leave out the end fsync; its wall time, like ours, includes it.
    return {"bytes": job["io_bytes"], "seconds": wall, "bytes_per_s": job["io_bytes"] / wall,
            "fio_reported_bytes_per_s": job["bw_bytes"], "cpu_s": cpu_seconds() - c0}


def run_gen(spec: GenSpec, url: str, exclude=frozenset(), sample_rss: bool = False, remove: bool = False,
            **kw) -> dict:
    """One timed generation (``remove``: the local dataset deleted after).  RSS sampling polls every
    process, so timed runs leave it off."""
    stats: dict = {}
    c0 = cpu_seconds()
    try:
        with peak_rss(set(exclude)) if sample_rss else nullcontext({}) as rss:
            m = generate(spec, url, progress=False, stats=stats, **kw)
    finally:
        if remove:
            shutil.rmtree(url, ignore_errors=True)
    return {"cpu_s": cpu_seconds() - c0, "bytes": m.total_bytes, "samples": m.total_samples, "shards": len(m.shards),
            "seconds": stats["seconds"], "bytes_per_s": m.total_bytes / stats["seconds"],
            "samples_per_s": m.total_samples / stats["seconds"], "peak_rss_bytes": rss.get("bytes"),
            "processes": rss.get("processes"), "workers": stats["workers"]}


def tokens(size: int, workers: int, **extra) -> GenSpec:
    """Raw 2048-token sequences, ``size`` bytes in 64 MiB shards (``extra``: other GenSpec fields)."""
    return GenSpec.from_mapping({"format": "raw", "modality": "tokens", "seq_len": 2048, "num_samples": size // 4096,
                                 "shard_size": "64MiB", "workers": workers, **extra})


def paired(ours: list[dict], peer: list[dict]) -> dict:
    """The per-round ratios ours / peer of bytes/s, their median, and best vs best."""
    r = harness.ratios(ours, peer, "bytes_per_s")["in_round_order"]
    return {"ratio_median": median(r), "ratios": r,
            "ratio_best": max(g["bytes_per_s"] for g in ours) / max(f["bytes_per_s"] for f in peer)}


def tokens_vs_fio(work: Path, size: int, workers: int, rounds: int) -> dict:
    spec = tokens(size, workers, vocab_size=50257)
    fio_runs, gen_runs = alternating(rounds, {"fio": lambda: run_fio(work / "fio.bin", size),
                                              "gen": lambda: run_gen(spec, str(work / "tokens"), remove=True)}).values()
    full = run_gen(spec, str(work / "tokens-rss"), sample_rss=True, remove=True)
    quarter = run_gen(replace(spec, num_samples=max(1, spec.num_samples // 4)), str(work / "tokens-quarter"),
                      sample_rss=True, remove=True)
    return {"size_bytes": size, "workers": workers, "fio": fio_runs, "iobench": gen_runs,
            "cpu_s_per_gib": {"fio": median(fio_runs, "cpu_s") * 2**30 / size,
                              "iobench": median(gen_runs, "cpu_s") * 2**30 / size}, **paired(gen_runs, fio_runs),
            "peak_rss_bytes": full["peak_rss_bytes"], "peak_rss_processes": full["processes"],
            "peak_rss_quarter_size_bytes": quarter["peak_rss_bytes"], "peak_rss_quarter_processes": quarter["processes"]}


def images_breakdown(work: Path, n: int, workers: int) -> dict:
    from iobench.formats import get_format
    from iobench.formats.base import Sample
    from iobench.io.checksum import ChecksumWriter
    from iobench.storage import open_backend

    spec = GenSpec.from_mapping({"format": "tar", "modality": "images", "num_samples": n, "shard_size": "8MiB"})
    # One writer's pipeline, each stage timed per sample in the same loop (same conditions for all parts).
    synth = make_synth(spec)
    backend = open_backend(str(work / "parts"))
    parts = {"image_synthesis": 0, "jpeg_encode": 0, "framing_checksum_io": 0}
    t_all = time.perf_counter_ns()
    with backend.open_output("parts.tar") as f:
        writer = get_format("tar").writer(ChecksumWriter(f, "xxh64"), modality="images")
        for i in range(n):
            t0 = time.perf_counter_ns()
            img, label = synth.render(i)
            t1 = time.perf_counter_ns()
            data = synth.encode(img)
            t2 = time.perf_counter_ns()
            writer.write(Sample(index=i, data=data, label=label))
            parts["image_synthesis"] += t1 - t0
            parts["jpeg_encode"] += t2 - t1
            parts["framing_checksum_io"] += time.perf_counter_ns() - t2
        t3 = time.perf_counter_ns()
        writer.finish()
    parts["framing_checksum_io"] += time.perf_counter_ns() - t3   # finish, fsync, rename, directory fsync
    total = (time.perf_counter_ns() - t_all) / 1e9
    shutil.rmtree(work / "parts")
    one = run_gen(spec, str(work / "img1"), remove=True)
    many = run_gen(replace(spec, workers=workers), str(work / "imgN"), remove=True)
    per = {k: v / 1e9 / n for k, v in parts.items()}
    return {"samples": n, "bytes": one["bytes"], "mean_sample_bytes": one["bytes"] / n,
            "workers_1": one, f"workers_{workers}": many, "workers": workers,
            "per_sample_s": {**per, "total": total / n},
            "share": {k: v / 1e9 / total for k, v in parts.items()}}


def s3_vs_put(work: Path, size: int, workers: int, rounds: int) -> dict:
    import s3fs

    from iobench.s3server import S3Server

    spec = tokens(size, workers, shard_size="32MiB")
    local = work / "s3src"
    generate(spec, str(local), progress=False)   # the peer's files, on local disk
    files = sorted(str(p) for p in local.iterdir() if p.name.startswith("shard-"))
    total = sum(os.path.getsize(f) for f in files)
    with S3Server(bucket="bench") as server:
        opts = {"key": server.access_key, "secret": server.secret_key}
        fs = s3fs.S3FileSystem(**server.storage_options())
        n = count()

        def put() -> dict:
            secs, _ = timed(lambda: fs.put(files, f"bench/put{next(n)}/"))
            return {"bytes": total, "seconds": secs, "bytes_per_s": total / secs}

        def gen() -> dict:
            return run_gen(spec, f"s3://bench/gen{next(n)}", exclude={server.pid}, endpoint_url=server.endpoint_url,
                           storage_options=opts)
        runs = alternating(rounds, {"put": put, "gen": gen})
    shutil.rmtree(local)
    return {"size_bytes": total, "workers": workers, "s3fs_put": runs["put"], "iobench": runs["gen"],
            **paired(runs["gen"], runs["put"])}


def machine(work: Path) -> dict:
    """harness.machine(), with the CPU model, the scratch file system and fio's version."""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = ""
    return harness.machine(cpu_model=model, filesystem=harness.filesystem(work), fio=harness.fio_version())


def rate(run: dict) -> str:
    return f"{format_bytes(run['bytes_per_s'])}/s"


def rounds_table(peer: str, ours: str, peer_runs: list[dict], our_runs: list[dict], ratios: list[float]) -> list[str]:
    """One line per alternating round: each side's rate and their ratio."""
    return table(["round", peer, ours, "ratio"],
                 [[i, rate(p), rate(g), f"{r:.2f}"] for i, (p, g, r) in enumerate(zip(peer_runs, our_runs, ratios))])


def render(res: dict) -> str:
    m = res["machine"]
    t, im, s3 = res["tokens"], res["images"], res.get("s3")
    lines = [
        "# Generation vs peers (reference run)", "",
        f"Measured {res['started_at']} with `{res['command']}`.", "",
        f"Machine: {m['cpu_model']} ({m['cpu_count']} cores), {format_bytes(m['memory_bytes'])} RAM, {m['os']}, file system "
        f"{m['filesystem']['type']} on {m['filesystem']['device']}, {m['fio']}, Python {m['python']}. **{m['note']}.**", "",
        "## Raw tokens vs fio sequential write (same size, same file system, fsync at end)", "",
        *rounds_table("fio", "iobench gen", t["fio"], t["iobench"], t["ratios"])]
    lines += ["", f"Size {format_bytes(t['size_bytes'])}, {t['workers']} writer processes; both sides timed by "
              "wall clock from start to durable (fio `--end_fsync=1`, iobench: every shard fsynced before the manifest is published). "
              f"**Median of per-round ratios iobench/fio = {t['ratio_median']:.2f}** (target >= 0.80; best vs best "
              f"{t['ratio_best']:.2f}). Each round runs both back to back in alternating order; the disk's speed "
              "swings with the other work on the machine, so the per-round ratio is the comparison.", "",
              f"CPU cost (user + system, all processes): iobench {t['cpu_s_per_gib']['iobench']:.2f} CPU-s per GiB "
              f"(token synthesis, checksum, write), fio {t['cpu_s_per_gib']['fio']:.2f} CPU-s per GiB. Load average "
              f"{res['loadavg_start'][0]:.1f} at the start of the run and {res['loadavg_end'][0]:.1f} at the end, on "
              f"{m['cpu_count']} cores: where other work leaves the generator less CPU than that per GiB, the "
              "generator, not the disk, sets the pace and the ratio drops; with free cores it is disk-bound like fio.",
              "",
              f"Peak RSS summed over all generator processes ({t['peak_rss_processes']} processes): "
              f"{format_bytes(t['peak_rss_bytes'])} for {format_bytes(t['size_bytes'])}; "
              f"{format_bytes(t['peak_rss_quarter_size_bytes'])} ({t['peak_rss_quarter_processes']} processes) for a "
              "quarter of that size. Memory does not grow with the dataset (streaming writes).", ""]
    if res.get("rss_check"):
        rc = res["rss_check"]
        lines += [f"**Peak RSS at {format_bytes(rc['bytes'])}: {format_bytes(rc['peak_rss_bytes'])}** summed over "
                  f"{rc['processes']} generator processes (target <= 512 MiB at 10 GiB); that run wrote "
                  f"{format_bytes(rc['bytes_per_s'])}/s.", ""]
    parts = {"image_synthesis": "image synthesis (crop of a seeded texture)", "jpeg_encode": "JPEG encoding (Pillow, CPU)",
             "framing_checksum_io": "tar framing + checksum + I/O + fsync"}
    lines += ["## Tar images (ImageNet-like JPEGs)", "",
              f"{im['samples']} samples, mean {format_bytes(im['mean_sample_bytes'])} per sample.", "",
              *table(["writers", "samples/s", "bytes/s"], [[g["workers"], f"{g['samples_per_s']:.1f}", rate(g)] for g in (
                  im["workers_1"], im[f"workers_{im['workers']}"])]),
              "", "Where the time goes (one writer; each stage timed per sample in the same loop):", "",
              *table(["part", "ms/sample", "share"], [[label, f"{im['per_sample_s'][k] * 1e3:.2f}", f"{im['share'][k]:.0%}"]
                                                      for k, label in parts.items()]), ""]
    if s3:
        lines += ["## Upload to the embedded S3 server (SeaweedFS) vs plain s3fs put", "",
                  *rounds_table("s3fs put (files on disk)", "iobench gen to s3://", s3["s3fs_put"], s3["iobench"], s3["ratios"]),
                  "", f"{format_bytes(s3['size_bytes'])}, {s3['workers']} writer threads sharing one s3fs client (s3fs put: its "
                  "default concurrency); iobench also generates the tokens while uploading. **Median of per-round ratios = "
                  f"{s3['ratio_median']:.2f}** (best vs best {s3['ratio_best']:.2f}).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = harness.parser(__doc__, str(REF), scratch_flag="--dir")
    ap.add_argument("--size", default="512MiB", help="raw token dataset size (and fio size)")
    ap.add_argument("--images", type=int, default=400, help="images for the tar run")
    ap.add_argument("--s3-size", default="128MiB", help="bytes uploaded to S3 (0 to skip)")
    ap.add_argument("--rss-size", default="0", help="also generate this much (untimed) to check peak RSS, e.g. 10GiB")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--render", metavar="JSON", help="only re-render the Markdown from a results JSON")
    args = ap.parse_args(argv)
    if args.render:
        res = json.loads(Path(args.render).read_text())
        (Path(args.out) / "generate.md").write_text(render(res) + "\n")
        return 0
    if not shutil.which("fio"):
        print("fio is not installed (apt-get install fio)", file=sys.stderr)
        return 2
    with harness.scratch("gen", args.dir) as work:
        res = {"started_at": now_iso(), "command": harness.command("bench_generate.py", argv),
               "machine": machine(work), "platform": platform.platform(), "loadavg_start": os.getloadavg()}
        print("raw tokens vs fio ...", file=sys.stderr)
        res["tokens"] = tokens_vs_fio(work, parse_size(args.size, "--size"), args.workers, args.rounds)
        if args.rss_size not in ("0", ""):
            print("peak RSS check ...", file=sys.stderr)
            res["rss_check"] = run_gen(tokens(parse_size(args.rss_size, "--rss-size"), args.workers), str(work / "rss"),
                                       sample_rss=True, remove=True)
        print("tar images ...", file=sys.stderr)
        res["images"] = images_breakdown(work, args.images, args.workers)
        s3_size = parse_size(args.s3_size, "--s3-size") if args.s3_size not in ("0", "") else 0
        if s3_size:
            print("s3 upload vs s3fs put ...", file=sys.stderr)
            # Object stores want requests in flight: at least 4 writers, as s3fs put keeps its files in flight.
            res["s3"] = s3_vs_put(work, s3_size, max(4, args.workers), args.rounds)
    res["loadavg_end"] = os.getloadavg()
    harness.write_report(Path(args.out) / "generate", res, render(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
