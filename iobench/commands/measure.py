"""`iobench measure -- python train.py`: the data stall of an unchanged training script's DataLoaders."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("measure", help="run a training script unchanged and measure its torch DataLoaders' stall",
                       description="Run COMMAND with an environment hook (a sitecustomize on PYTHONPATH, "
                                   "iobench.watch_hook) that wraps every torch DataLoader it iterates in "
                                   "iobench.watch; print each loader's stall, and write the busiest one's results. "
                                   "Other loaders (tf.data, generators) are not hooked: wrap them in iobench.watch.")
    p.add_argument("--json", metavar="PATH", help="write the results of the loader with the most steps to this file "
                                                  "(the load schema, command 'watch')")
    p.add_argument("--path", metavar="DATA", help="where the data lives: the device's bytes read and the read "
                                                  "amplification are counted for its block device")
    p.add_argument("--keep", metavar="DIR", help="keep every watched loader's results (loader-PID-N.json) in DIR")
    # dest "argv", not "command": the CLI keeps the chosen subcommand's name in args.command
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the command to run, after --, e.g. -- python train.py --epochs 1")
    from .. import guard

    guard.declare(p, guard.out_file("json", "--json"), guard.out_dir("keep", "--keep"),
                  guard.in_file("path", "--path", must_exist=False))   # --path: only its block device is looked up
    p.set_defaults(func=run)


def run(args) -> int:
    import os
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from ..errors import ConfigError
    from ..io.inputs import loads_json
    from ..watch_hook import SITECUSTOMIZE

    cmd = list(args.argv)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise ConfigError("COMMAND", "no command to run", "e.g. iobench measure --json run.json -- python train.py")
    if args.json == "-":
        raise ConfigError("--json", "the command's own output goes to stdout", "give a file, e.g. --json run.json")
    if args.path is not None and not os.path.exists(args.path):
        raise ConfigError("--path", f"{args.path} does not exist", "give the directory or file the script reads")
    if args.keep is not None and os.path.exists(args.keep) and os.listdir(args.keep):
        raise ConfigError("--keep", f"{args.keep} is not empty", "give a new or empty directory")
    if shutil.which(cmd[0]) is None and not os.path.exists(cmd[0]):
        raise ConfigError("COMMAND", f"{cmd[0]!r} is not a program on PATH", "give the interpreter, e.g. -- python train.py")
    hook = Path(tempfile.mkdtemp(prefix="iobench-measure-"))
    try:
        (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
        out_dir = Path(args.keep) if args.keep else hook / "results"
        out_dir.mkdir(parents=True, exist_ok=True)
        # iobench itself and its dependencies, appended after the command's own paths (its numpy wins)
        syspath = [str(Path(__file__).resolve().parents[2])] + [p for p in sys.path if "site-packages" in p]
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(hook)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env["IOBENCH_MEASURE_SYSPATH"] = os.pathsep.join(syspath)
        env["IOBENCH_MEASURE_DIR"] = str(out_dir)
        if args.path:
            env["IOBENCH_MEASURE_PATH"] = os.path.abspath(args.path)
        rc = subprocess.call(cmd, env=env)
        docs = []
        for f in sorted(out_dir.glob("loader-*.json")):
            try:
                docs.append((f, loads_json(f.read_text())))
            except (OSError, ValueError):
                continue
        if not docs:
            print(f"iobench measure: no torch DataLoader was iterated by {' '.join(cmd)} (exit {rc}); the hook "
                  "watches torch.utils.data.DataLoader only: wrap other loaders in iobench.watch(...)", file=sys.stderr)
            return rc or 1
        _print(docs, rc)
        if args.json:
            best = max(docs, key=lambda d: d[1]["metrics"]["steps"])
            from ..io.atomic import atomic_write_bytes

            atomic_write_bytes(args.json, best[0].read_bytes())
            print(f"results: {args.json}")
        return rc
    finally:
        shutil.rmtree(hook, ignore_errors=True)


def _print(docs, rc: int) -> None:
    from .load import headline

    docs = sorted(docs, key=lambda d: -d[1]["metrics"]["steps"])
    for path, doc in docs:
        m = doc["metrics"]
        ld = m.get("loader") or {}
        who = doc["config"].get("name") or path.name
        workers = ld.get("num_workers")
        print(f"{who} (num_workers {workers if workers is not None else '?'}"
              + (f", prefetch_factor {ld['prefetch_factor']}" if ld.get("prefetch_factor") else "") + "): "
              + headline(m).replace("[watch, ", "["))
        rec = m.get("prefetch_recommendation") or {}
        if rec.get("workers_recommended"):
            print(f"  advice: num_workers {rec['workers_recommended']}, prefetch_factor "
                  f"{rec['prefetch_factor_recommended']} ({m.get('batch_service_basis')})"
                  + (f"; {rec['note']}" if rec.get("note") else ""))
        for w in doc.get("warnings", []):
            print(f"  warning: {w}")
    if rc:
        print(f"the command exited {rc}")
