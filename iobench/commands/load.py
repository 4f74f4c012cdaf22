"""`iobench load DATASET_URL`: read a dataset through the prefetching loader and measure data stall."""

from __future__ import annotations

from ..schema import STALL_RATIO

# flag -> LoadConfig field, for flags that map one-to-one
_FLAGS = {"workers": "workers", "prefetch": "prefetch", "batch_size": "batch_size", "epochs": "epochs",
          "steps": "steps", "shuffle_buffer": "shuffle_buffer", "seed": "seed", "compute_mode": "compute_mode",
          "compute_fn": "compute_fn", "cache": "cache", "emulate": "emulate", "device": "device",
          "endpoint_url": "endpoint_url", "s3_block_size": "s3_block_size", "s3_concurrency": "s3_concurrency",
          "s3_client": "s3_client",
          "retries": "retries", "retry_budget": "retry_budget_s", "error_rate": "error_rate",
          "timeout_rate": "timeout_rate", "slot_bytes": "slot_bytes", "start_method": "start_method",
          "read_ahead": "read_ahead", "block_read": "block_read", "access": "access",
          "stream_read_size": "stream_read_size",
          "min_steps": "min_steps", "max_time": "max_time_s"}


def register(sub) -> None:
    from .. import guard
    from ..cli import add_endpoint_flag, add_json_flag, add_progress_flag, add_set_flag, add_storage_option_flag

    p = sub.add_parser("load", help="read a dataset with W workers and Q prefetch slots; measure stall and latency",
                       description="Read a dataset through its manifest with a prefetching multi-worker loader, "
                                   "emulate the training step, and measure data stall, throughput and latency "
                                   "percentiles.  See README: Loader.")
    p.add_argument("dataset", metavar="DATASET_URL", help="dataset root (local path, s3://bucket/prefix, memory://), "
                                                        "one shard file or a brace range of shards "
                                                        "(train-{000000..000003}.tar: indexed now if unlisted)")
    g_read = p.add_argument_group("what to read")
    g_read.add_argument("--access", metavar="map|stream|block|memmap|auto",
                        help="access pattern: map (PyTorch map-style, ranged read per sample), stream (webdataset: shards "
                             "in order through a per-worker shuffle buffer), block (full-window shuffle, lumpy), memmap "
                             "(nanoGPT/Megatron: token rows sliced from mapped local shards, page faults are the I/O); "
                             "default auto: raw/files -> map, tar/parquet/tfrecord -> stream")
    g_read.add_argument("--stream-read-size", metavar="SIZE", help="stream: bytes of whole samples per read (64KiB)")
    g_read.add_argument("--tiers", metavar="FILE", help="read through storage tiers (iobench.tiers) described in FILE")
    g_read.add_argument("--staging", choices=("prestage", "ondemand", "stream"), default=None,
                        help="with --tiers: how shards reach the fast tier (default ondemand)")
    g_read.add_argument("--workload", metavar="NAME|FILE", help="start from a workload's `load` section")
    g_loader = p.add_argument_group("the loader (torch DataLoader's knobs)")
    g_loader.add_argument("--workers", "-W", type=int, metavar="N",
                          help="worker processes (default 2); 0: batches made in the consumer process itself "
                               "(DataLoader num_workers=0: no hand-off, nothing prefetched)")
    g_loader.add_argument("--prefetch", "-Q", type=int, metavar="N",
                          help="batches in flight per worker for map/stream (DataLoader's prefetch_factor), in all for "
                               "block (default 2)")
    g_loader.add_argument("--batch-size", "-B", type=int, metavar="N", help="samples per batch (default 32)")
    g_loader.add_argument("--epochs", type=int, metavar="N", help="epochs to read (default 1)")
    g_loader.add_argument("--steps", type=int, metavar="N", help="stop after this many steps instead (epochs repeat as needed)")
    g_loader.add_argument("--shuffle-buffer", type=int, metavar="N", help="samples shuffled together (default 1000; 0: no sample shuffle)")
    g_loader.add_argument("--no-shuffle", action="store_true", help="read shards and samples in stored order")
    g_loader.add_argument("--drop-last", action="store_true", help="drop short batches at the end of each shuffle block")
    g_loader.add_argument("--seed", type=int, metavar="N", help="order seed (default 0)")
    g_loader.add_argument("--decode", action="store_true", help="decode images (JPEG -> RGB arrays) in the workers")
    g_loader.add_argument("--device", help="where batches are delivered: cpu (default) or cuda (GPU package)")
    g_loader.add_argument("--read-ahead", type=int, metavar="N",
                          help="block: blocks each worker reads ahead while collating; map: extra sample reads each worker keeps "
                               "in flight (default 0: prefetch is exactly Q, one read at a time)")
    g_loader.add_argument("--block-read", choices=("read", "mmap"),
                          help="block, local token rows: read (default: one preadv per shard into a reused buffer) or "
                               "mmap (each shard mapped, MAP_POPULATE, and its batches gathered from the page cache "
                               "itself: no copy; cheaper on CPUs with large caches, see docs/design.md)")
    g_loader.add_argument("--slot-bytes", type=int, metavar="N", help="bytes per prefetch slot (default: sized from the manifest)")
    g_loader.add_argument("--start-method", choices=("fork", "forkserver", "spawn"), help="worker start method (fork)")
    g_step = p.add_argument_group("the training step")
    g_step.add_argument("--compute-ms", metavar="T", help="emulated compute per step in ms (default 0)")
    g_step.add_argument("--compute", metavar="SPEC",
                        help="compute time per step: 200ms | normal:mean=200ms,std=20ms | "
                             "lognormal:p50=180ms,p99=400ms | file:PATH (overrides --compute-ms)")
    g_step.add_argument("--compute-mode", choices=("sleep", "spin", "callback"),
                        help="sleep (accelerator), spin (CPU contention) or callback (--compute-fn)")
    g_step.add_argument("--compute-fn", metavar="MODULE:FUNCTION", help="a real step, called as fn(batch, step)")
    g_storage = p.add_argument_group("storage")
    g_storage.add_argument("--cache", choices=("cold", "warm", "as-is"), help="page-cache state before reading (default as-is)")
    g_storage.add_argument("--emulate", metavar="SPEC", help="emulated storage: const:250ms, lognormal:p50=20ms,p99=500ms, "
                                                              "spike:p=0.01,extra=2s, bw:1GB/s, nvme|pfs|object (join with +)")
    g_storage.add_argument("--odirect", action="store_true", help="local shards: O_DIRECT reads into aligned buffers")
    add_endpoint_flag(g_storage)
    add_storage_option_flag(g_storage)
    g_storage.add_argument("--s3-block-size", metavar="SIZE", help="ranged GET size on object stores (default 8MiB)")
    g_storage.add_argument("--s3-concurrency", type=int, metavar="N", help="ranged GETs in flight per worker (default 4)")
    g_storage.add_argument("--s3-client", choices=("auto", "s3fs", "obstore"),
                           help="client for S3 reads: obstore (the s3fast extra; ~2x faster here) or s3fs; "
                                "auto (default): obstore when installed")
    g_storage.add_argument("--retries", type=int, metavar="N", help="attempts per request (default 5)")
    g_storage.add_argument("--retry-budget", metavar="DURATION", help="time one request may spend retrying (30s)")
    g_faults = p.add_argument_group("faults and integrity")
    g_faults.add_argument("--error-rate", type=float, metavar="P", help="inject read errors with this probability (seeded)")
    g_faults.add_argument("--timeout-rate", type=float, metavar="P", help="inject read timeouts with this probability (seeded)")
    g_faults.add_argument("--verify-checksums", action="store_true",
                          help="check each shard's manifest checksum as it is read (cost in metrics.verify_checksums)")
    g_stop = p.add_argument_group("when to stop")
    g_stop.add_argument("--until-stable", action="store_true",
                        help="run until the stall (±--stall-ci pp) and P99 batch time (±25%%) intervals are narrow, "
                             "or --max-time passes; the results carry the intervals either way")
    g_stop.add_argument("--min-steps", type=int, metavar="N", help="with --until-stable: at least this many steps (50)")
    g_stop.add_argument("--max-time", metavar="DURATION", help="with --until-stable: time cap (60s)")
    g_stop.add_argument("--stall-ci", type=float, metavar="PP", help="with --until-stable: stall interval half-width "
                                                                    "in percentage points (2)")
    g_stop.add_argument("--repeat", type=int, metavar="N", help="run the load N times and report the spread")
    g_advice = p.add_argument_group("advice and analysis")
    g_advice.add_argument("--recommend", action="store_true",
                          help="recommend workers and prefetch depth (and their host memory) from the batch service times")
    g_advice.add_argument("--validate", action="store_true",
                          help="with --recommend: measure depth 1, rec/2, rec, 2*rec and workers +-1 around it")
    g_advice.add_argument("--analyze", action="store_true", help="synthetic / warm / cold passes: prep vs fetch stall")
    from ..driver import default_host_ceiling
    g_advice.add_argument("--host-ceiling", default=default_host_ceiling(), choices=("cached", "measure", "off"),
                          help="measure this host's read ceiling for the batch shape beside the storage number "
                               "(iobench.driver): cached (once per host and shape), measure, off "
                               "(default: $IOBENCH_HOST_CEILING, else cached)")
    add_set_flag(p)
    add_json_flag(p)
    guard.declare(p, guard.dataset("dataset", "DATASET_URL"), guard.tiers_file(),
                  guard.in_file("workload", "--workload"), guard.in_file("compute", "--compute", prefix="file:"))
    add_progress_flag(p)
    p.set_defaults(func=run)


def build_config(args):
    from ..config import build, command_section
    from ..errors import ConfigError
    from ..loader.core import LoadConfig

    if args.staging and not args.tiers:
        raise ConfigError("--staging", "needs --tiers", "add --tiers FILE, or drop --staging")
    flags = {key: getattr(args, flag, None) for flag, key in _FLAGS.items()}
    from ..units import parse_duration

    for flag, key in (("--max-time", "max_time_s"), ("--retry-budget", "retry_budget_s")):
        if flags[key] is not None:   # a duration with its unit, as every door takes it ("60" is refused)
            flags[key] = parse_duration(flags[key], flag, allow_zero=False)
    # store_true flags: given sets the key, absent leaves the workload's (or --set's) value
    flags |= {"shuffle": False if args.no_shuffle else None, "drop_last": args.drop_last or None,
              "odirect": args.odirect or None, "verify_checksums": args.verify_checksums or None,
              "until_stable": args.until_stable or None}
    if args.decode:
        from ..extras import require

        require("PIL", "--decode")  # before workers start: a worker's ImportError would be a hang or a traceback
        flags["decode"] = True
    if args.compute is not None:
        flags["compute"] = args.compute
    elif args.compute_ms is not None:
        try:
            ms = float(args.compute_ms)
        except ValueError:
            raise ConfigError("--compute-ms", f"{args.compute_ms!r} is not a number of milliseconds",
                              "e.g. --compute-ms 200, or --compute 'normal:mean=200ms,std=20ms'") from None
        from ..bounds import MILLISECONDS

        MILLISECONDS.check("--compute-ms", ms)   # finite, >= 0, within the 7-day cap
        flags["compute"] = f"{ms}ms"
    if args.stall_ci is not None:
        if not 0 < args.stall_ci < 100:
            raise ConfigError("--stall-ci", f"must be within 0..100 percentage points, got {args.stall_ci}",
                              "e.g. --stall-ci 2")
        flags["stall_ci"] = args.stall_ci / 100
    if args.repeat is not None and args.repeat < 1:
        raise ConfigError("--repeat", f"must be at least 1, got {args.repeat}", "e.g. --repeat 5")
    if args.validate and not args.recommend:
        raise ConfigError("--validate", "needs --recommend", "add --recommend")
    section = command_section(args.workload, "load", flags, args.set, "iobench load")
    section["dataset"] = args.dataset  # the positional argument names the data, whatever the workload says
    return build(LoadConfig, section, "load")


def run(args) -> int:
    from dataclasses import replace

    from ..config import to_dict
    from ..results import Results
    from ..units import format_bytes, format_seconds
    from ..dist import detect_world
    from ..dist.launch import collect, start

    cfg = build_config(args)
    world = detect_world()
    source = _tiers_source(args, cfg) if args.tiers else None
    from ..cli import want_progress
    from ..storage import parse_storage_options

    # storage options travel beside the config, never in it: results must not carry credentials
    kw = dict(rank=world.rank, world=world.size, progress=want_progress(args) and world.rank == 0,
              storage_options=parse_storage_options(args.storage_option) or None)
    # ranks agree on the config, every rank can read the manifest, then they start together:
    # world throughput is total bytes / the longest wall time
    start(world, "load", to_dict(cfg) | {"tiers": args.tiers, "staging": args.staging, "analyze": args.analyze},
          check=(lambda: _check_dataset(cfg)) if world.is_mpi else None)
    analysis = None
    if args.analyze:
        if source is not None:
            from ..errors import ConfigError

            raise ConfigError("--analyze", "cannot be combined with --tiers", "analyze the dataset URL directly")
        from ..loader.analysis import analyze   # here: the planner it imports is start-up a plain load skips

        analysis, run_ = analyze(cfg, **kw)
    else:
        measure_once = _driver(args, cfg, source, world, kw)
        run_ = measure_once()
        if args.repeat and args.repeat > 1:
            runs = [run_] + [measure_once() for _ in range(args.repeat - 1)]
            run_ = _median_run(runs)
    metrics = dict(run_.metrics)
    if args.repeat and args.repeat > 1 and not args.analyze:
        metrics["repeats"] = repeat_spread([r.metrics for r in runs])
    if source is not None and hasattr(source, "metrics"):
        metrics["tiers"] = source.metrics()  # hit ratios, bytes per tier pair, evictions, time to first batch
    if analysis is not None:
        metrics["analysis"] = analysis
    if args.recommend:
        from ..loader.analysis import recommend, validate

        rec = recommend(metrics, cfg.compute_model().nominal_s, consumers=world.size)
        if args.validate and rec.get("depth_recommended"):
            rec["validation"] = validate(replace(cfg, cache=cfg.cache), rec, access=metrics["access"], **kw)
        metrics["prefetch_recommendation"] = rec
    results = Results(command="load", config=to_dict(cfg) | ({"tiers": args.tiers, "staging": args.staging or "ondemand"}
                                                             if args.tiers else {}),
                      environment=run_.environment)
    for w in run_.warnings:
        results.warn(w)
    from ..loader.ranks import merge_ranks

    if not collect(world, results, metrics, merge_ranks, merge_only=("series",)):
        return 0
    if world.size > 1:
        if "prefetch_recommendation" in metrics:
            from ..loader.analysis import recommend

            results.metrics["prefetch_recommendation"] = recommend(results.metrics, cfg.compute_model().nominal_s,
                                                                   consumers=world.size)
        results.metrics["rank0"] = {k: metrics[k] for k in (STALL_RATIO, "samples", "wall_s")}
        metrics = results.metrics
    if args.json:
        results.write(args.json)
    m = metrics
    print(headline(m))
    drive = m.get("drive") or {}
    # "within 20% of the ceiling" is the read-path host bound only: a hand-over or CPU-preparation
    # host bound may come without a ceiling measured (host_ceiling off)
    if (drive.get("judgement") or {}).get("cause") == "the host's read path" and drive.get("host_ceiling"):
        from ..units import format_rate

        c = drive["host_ceiling"]
        print(f"host-bound: storage delivered {format_rate(drive['rates']['capacity_bytes_per_s'] or 0)}, within 20% "
              f"of what this host's {c['cores']} cores read from memory ({format_rate(c['bytes_per_s'])}): "
              "the storage can deliver more, the answer is a lower bound")
    if world.size > 1:
        print(f"world: {world.size} ranks on {len(world.nodes)} node(s); "
              f"{m['world']['straggler']['line']}")
    if m.get("repeats"):
        r = m["repeats"]
        st = r[STALL_RATIO]
        ci = f" [{st['ci95'][0]:.1%}, {st['ci95'][1]:.1%}]" if st.get("ci95") else ""
        print(f"repeats: {r['n']} runs, stall mean {st['mean']:.1%}{ci} (min {st['min']:.1%}, max {st['max']:.1%}), "
              f"samples/s spread {r['steady_samples_per_s']['relative_spread']:.1%} (MLPerf asks <= 5%); "
              "the detail is the median-stall run's")
    if analysis is not None:
        print(f"prep stall {analysis['prep_stall_ratio']:.1%}  fetch stall {analysis['fetch_stall_ratio']:.1%}")
    rec = metrics.get("prefetch_recommendation")
    if rec:
        if rec.get("depth_recommended"):
            from ..report.format import prefetch_advice   # the one wording: the report and `iobench run` use it

            print(f"advice: {prefetch_advice(rec)}, host memory "
                  f"{format_bytes(rec['host_bytes_loader'])}; one producer would need depth >= "
                  f"{rec['depth_min']} (ceil P99 {format_seconds(rec['p99_batch_service_s'])} / compute "
                  f"{format_seconds(rec['compute_s'])})" + (f"; {rec['note']}" if rec.get("note") else ""))
        else:
            print(f"advice: {rec.get('note')}")
        if rec.get("validation"):
            v = rec["validation"]
            runs = ", ".join(f"W{x['workers']}/Q{x['prefetch']} {x[STALL_RATIO]:.1%}" for x in v["runs"])
            lm = v["least_memory_within_2pp"]
            print(f"validation: {runs}; recommended {'is' if v['within_2pp_of_best'] else 'is NOT'} within 2 pp "
                  f"of the best ({v['best_stall_ratio']:.1%}); least memory within 2 pp: W{lm['workers']}/"
                  f"Q{lm['prefetch']} ({format_bytes(lm['host_bytes'])})")
    for w in results.warnings:
        print(f"warning: {w}")
    if args.json and args.json != "-":
        print(f"results: {args.json}")
    return 0


def _driver(args, cfg, source, world, kw):
    """One plain load through the measurement driver (iobench.driver): residency after the run, the
    host's ceiling beside the storage number, the bound and its cause in ``metrics.drive``.  Tiered
    and multi-rank loads run the loader directly (their storage is not one tier, their host not one)."""
    from ..loader.core import run_load

    if source is not None or world.size > 1:
        return lambda: run_load(cfg, source=source, **kw)
    from dataclasses import replace

    from ..driver import Dataset, DriveConfig, measure
    from ..index import dataset_manifest, resolve_dataset_url
    from ..storage import open_backend

    so = kw["storage_options"]
    ref = resolve_dataset_url(cfg.dataset)     # a brace range or one shard: those files, under their directory
    if ref.only is not None:
        cfg = replace(cfg, dataset=ref.root)
    manifest = dataset_manifest(open_backend(cfg.dataset, endpoint_url=cfg.endpoint_url, storage_options=so,
                                             field_name="dataset", check=True), ref.only)
    dc = DriveConfig(load=cfg, host_ceiling=args.host_ceiling, one_pass_when_cold=False)

    def once():
        o = measure(dc, Dataset(url=cfg.dataset, format=manifest.format), manifest, so, progress=kw["progress"])
        o.run.metrics["drive"] = o.to_dict()
        return o.run
    return once


def _tiers_source(args, cfg):
    from ..errors import ConfigError
    from ..index import open_dataset

    try:
        from ..tiers import loader_source
    except ImportError as e:
        raise ConfigError("--tiers", f"storage tiers are not available in this build ({e})",
                          "drop --tiers, or install an iobench with iobench.tiers.loader_source") from None
    backend, manifest = open_dataset(cfg.dataset, endpoint_url=cfg.endpoint_url)
    return loader_source(args.tiers, args.staging or "ondemand", manifest, backend)


def _check_dataset(cfg):
    """Run on every rank before the start barrier: this rank can open the dataset's manifest."""
    from ..index import open_dataset

    return open_dataset(cfg.dataset, endpoint_url=cfg.endpoint_url)[1]


def headline(m: dict) -> str:
    """The answer first: steady-state stall with its interval, wall-clock AU, and how much it rests on."""
    from ..units import format_rate, format_seconds

    ci = (m.get("intervals") or {}).get(STALL_RATIO) or {}
    hw = ci.get("half_width")
    stall = f"stall {m[STALL_RATIO]:.1%}" + (f" ±{hw * 100:.1f} pp" if hw is not None else " (no interval)")
    p99 = (m.get("intervals") or {}).get("batch_service_p99_s") or {}
    p99_txt = format_seconds(m["batch_service_s"]["p99"] or 0) if m.get("batch_service_s") else \
        format_seconds(m["batch_io_s"]["p99"] or 0)
    if p99 and p99.get("high") is None:
        p99_txt += " (too few batches)"
    wall_au = m.get("wall_clock_utilization")
    line = (f"{stall}  AU {m['accelerator_utilization']:.1%} steady"
            + (f", {wall_au:.1%} wall-clock" if wall_au is not None else "")
            + f"  {m['throughput']['samples_per_s'] or 0:,.0f} samples/s  "
              f"{format_rate(m['throughput']['bytes_per_s'] or 0)}  batch time p99 {p99_txt}  "
              f"[{m.get('access', 'block')}, {m['steps']} steps, {_window_txt(m)}"
            + ("" if m.get("stable", True) else ", NOT stable") + "]")
    wf = m.get("warmup_fraction")
    if wf is not None and wf > 0.10:
        line += f"  — warm-up {m['warmup_s']:.2f} s is {wf:.0%} of the wall clock"
    return line


def _window_txt(m: dict) -> str:
    """Which steps the headline stall counts: all but the first (MLPerf), or the steady window and the MLPerf figure."""
    win = m.get("steady_window") or {}
    if "by_rank" in win:
        return "first excluded, steady window per rank"
    if not win or win["from_step"] <= 1 and win["to_step"] >= m["steps"]:
        return "first excluded"
    return (f"steady steps {win['from_step']}-{win['to_step'] - 1}; all but the first: stall "
            f"{m['stall_ratio_first_step_excluded']:.1%}")


def _median_run(runs):
    order = sorted(runs, key=lambda r: r.metrics[STALL_RATIO])
    return order[(len(order) - 1) // 2]


def repeat_spread(ms: list[dict]) -> dict:
    """Repeated identical loads, by the one repeat policy every command uses (the suite's
    ``merge_repeats`` too): each metric's mean over the repeats with its Student t 95% interval
    (``ci95``), plus the spread (MLPerf Storage asks for runs within 5% of each other)."""
    import statistics

    from ..loader.stability import mean_interval

    def spread(vals):
        vals = [v for v in vals if v is not None]
        mean = statistics.fmean(vals) if vals else None
        iv = mean_interval(vals)
        return {"values": vals, "mean": mean, "ci95": [iv["low"], iv["high"]] if iv["low"] is not None else None,
                "min": min(vals, default=None), "max": max(vals, default=None),
                "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0,
                "relative_spread": (max(vals) - min(vals)) / mean if vals and mean else 0.0}

    return {"n": len(ms), "rule": "mean of the repeats, Student t 95% (ci95); the results' body is the median-stall "
                                  "run's", STALL_RATIO: spread([m[STALL_RATIO] for m in ms]),
            "steady_samples_per_s": spread([m["throughput"]["steady_samples_per_s"] for m in ms]),
            "batch_service_p99_s": spread([(m.get("batch_service_s") or {}).get("p99") for m in ms]),
            "within_5_percent": spread([m["throughput"]["steady_samples_per_s"] for m in ms])["relative_spread"]
            <= 0.05}
