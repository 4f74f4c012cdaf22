"""Crash-safety harness: SIGKILL a saving process at named points and at random times, then
check that restore returns the newest committed checkpoint, bit-exactly, and never a partial one.

Starting Python for every trial costs most of a second on a busy machine, so trials are
forked from a *zygote*: one child process that has imported everything and forks a fresh
saver per trial (it is single-threaded when it forks, so forking is safe).  The saver
reports each durable commit on a progress file before going on; after the kill, the
harness restores from the same tiers and compares against the state it can regenerate
from (seed, step).

    python -m iobench.checkpointing.crash --trials 40     # a campaign from the command line
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .hooks import ENV, POINTS


@dataclass(frozen=True)
class Trial:
    workdir: str
    steps: tuple[int, ...] = (1, 2, 3)
    params: int = 3000
    dp: int = 2
    mode: str = "async"
    crash_at: str | None = None        # "point" or "point:N"
    kill_after_s: float | None = None  # random-time kill by the harness
    seed: int = 0
    keep: int = 1                      # retention on both tiers: every commit deletes older steps
    durable: str | None = None         # s3://... (endpoint and keys from AWS_* variables); default: a local dir


@dataclass
class Outcome:
    trial: Trial
    signal: int | None
    committed: list[int] = field(default_factory=list)
    restored_step: int | None = None
    violation: str | None = None
    seconds: float = 0.0
    save_seconds: float = 0.0


def _spec(trial: Trial):
    from .state import from_params

    return from_params(trial.params, dp=trial.dp, zero_stage=1)


def _tiers(trial: Trial):
    from iobench.storage import open_backend

    durable = trial.durable or os.path.join(trial.workdir, "durable")
    return open_backend(os.path.join(trial.workdir, "local")), open_backend(durable)


def run_saver(trial: Trial) -> None:
    """The body of one forked saver: save every step, report durable commits."""
    from .commit import Checkpointer, EngineConfig
    from .snapshot import LiveState, local_ranks

    spec = _spec(trial)
    live = LiveState(spec, local_ranks(spec))
    local, durable = _tiers(trial)
    fd = os.open(os.path.join(trial.workdir, "progress"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def on_commit(rec):
        os.write(fd, f"committed {rec.step}\n".encode())

    cfg = EngineConfig(mode=trial.mode, keep_local=trial.keep, keep_durable=trial.keep)
    with Checkpointer(spec, live.ranks, local, durable, cfg, on_commit=on_commit) as ck:
        for s in trial.steps:
            live.fill(trial.seed, s)
            ck.save(s, live)
    os.write(fd, b"done\n")
    os.close(fd)


def verify(trial: Trial, committed: list[int]) -> tuple[int | None, str | None]:
    """(restored step, violation or None) for the tiers a trial left behind."""
    from iobench.errors import NoCheckpointError

    from .restore import restore
    from .snapshot import LiveState, local_ranks

    local, durable = _tiers(trial)
    newest = max(committed) if committed else None
    for tiers in ([("local", local), ("durable", durable)], [("durable", durable)]):
        try:
            got = restore(tiers, cold=False)
        except NoCheckpointError:
            if newest is not None:
                return None, f"step {newest} was reported committed but nothing restores"
            continue
        if newest is not None and got.step < newest:
            return got.step, f"restored step {got.step}, older than committed step {newest}"
        if got.step not in trial.steps:
            return got.step, f"restored step {got.step} that was never saved"
        spec = _spec(trial)
        live = LiveState(spec, local_ranks(spec))
        live.fill(trial.seed, got.step)
        for r in live.ranks:
            for a, b in zip(live.arrays[r], got.arrays[r]):
                if not np.array_equal(a.view(np.uint8), b.view(np.uint8)):
                    return got.step, f"step {got.step} restored with wrong bytes on rank {r}"
    return (got.step if "got" in locals() else None), None


def _zygote_main() -> None:
    """Read one JSON trial per line; fork a saver; answer its pid, then how it ended."""
    import iobench.checkpointing.commit   # warm imports before forking
    import iobench.checkpointing.restore  # noqa: F401

    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        trial = Trial(**{**json.loads(line), "steps": tuple(json.loads(line)["steps"])})
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                if trial.crash_at:
                    os.environ[ENV] = trial.crash_at
                else:
                    os.environ.pop(ENV, None)
                run_saver(trial)
            except BaseException as e:  # noqa: BLE001  (report, then exit non-zero)
                sys.stderr.write(f"saver failed: {type(e).__name__}: {e}\n")
                code = 3
            finally:
                os._exit(code)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
        out.write(json.dumps({"signal": sig, "code": code}) + "\n")
        out.flush()


class Zygote:
    """A pre-imported process that forks one saver per trial."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "iobench.checkpointing.crash", "--zygote"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env={k: v for k, v in os.environ.items() if k != ENV})

    def run(self, trial: Trial) -> Outcome:
        Path(trial.workdir).mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        self.proc.stdin.write(json.dumps(asdict(trial)) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self.proc.stdout.readline())["pid"]
        t_start = time.perf_counter()
        if trial.kill_after_s is not None:
            time.sleep(trial.kill_after_s)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the crash-harness zygote died")
        end = json.loads(line)
        save_s = time.perf_counter() - t_start
        if end["code"] not in (None, 0):
            raise RuntimeError(f"saver exited with code {end['code']} (not a kill): see stderr")
        progress = Path(trial.workdir, "progress")
        lines = progress.read_text().split("\n") if progress.exists() else []
        committed = [int(x.split()[1]) for x in lines if x.startswith("committed ")]
        out = Outcome(trial=trial, signal=end["signal"], committed=committed, save_seconds=save_s)
        out.restored_step, out.violation = verify(trial, committed)
        out.seconds = time.perf_counter() - t0
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def __enter__(self) -> "Zygote":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def plan_trials(root: str, n_random: int, seed: int = 0, nths: tuple[int, ...] = (1, 2),
                random_window_s: float = 0.3, points: tuple[str, ...] = POINTS,
                durable_root: str | None = None) -> list[Trial]:
    """Every named point at each nth occurrence, then ``n_random`` random-time kills."""
    rng = random.Random(seed)
    trials = []
    i = 0

    def durable(i):
        return f"{durable_root.rstrip('/')}/t{i:03d}" if durable_root else None

    for p in points:
        for n in nths:
            trials.append(Trial(workdir=os.path.join(root, f"t{i:03d}"), crash_at=f"{p}:{n}", seed=i,
                                mode="sync" if i % 3 == 2 else "async", durable=durable(i)))
            i += 1
    for _ in range(n_random):
        trials.append(Trial(workdir=os.path.join(root, f"t{i:03d}"), kill_after_s=rng.uniform(0, random_window_s),
                            seed=i, mode="sync" if i % 3 == 2 else "async", durable=durable(i)))
        i += 1
    return trials


def campaign(root: str, n_random: int, seed: int = 0, random_window_s: float | None = None,
             points: tuple[str, ...] = POINTS, nths: tuple[int, ...] = (1, 2),
             durable_root: str | None = None) -> list[Outcome]:
    """Run the trials; an ``s3://`` durable_root takes its endpoint and keys from the AWS_* variables."""
    with Zygote() as z:
        if random_window_s is None:
            # Calibrate: random kills should land anywhere in a save sequence, so time one clean run.
            # The first run is slower (cold caches), so take the faster of two.
            clean = [z.run(Trial(workdir=os.path.join(root, f"calibrate{k}"),
                                 durable=f"{durable_root.rstrip('/')}/calibrate{k}" if durable_root else None))
                     for k in range(2)]
            random_window_s = max(0.05, 0.8 * min(c.save_seconds for c in clean))
        return [z.run(t) for t in plan_trials(root, n_random, seed, nths, random_window_s, points, durable_root)]


def main(argv: list[str] | None = None) -> int:
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m iobench.checkpointing.crash")
    ap.add_argument("--zygote", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--trials", type=int, default=40, help="random-time kills (named points come on top)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="also write OUT.json and OUT.md (e.g. reports/reference/ckpt_crash)")
    args = ap.parse_args(argv)
    if args.zygote:
        _zygote_main()
        return 0
    with tempfile.TemporaryDirectory(prefix="iobench-crash-") as root:
        outs = campaign(root, args.trials, args.seed)
    bad = [o for o in outs if o.violation]
    killed = sum(1 for o in outs if o.signal == signal.SIGKILL)
    print(f"{len(outs)} trials, {killed} killed, {len(bad)} violations")
    for o in outs:
        what = o.trial.crash_at or f"kill after {o.trial.kill_after_s:.3f}s"
        print(f"  {what:28s} signal={o.signal} committed={o.committed} restored={o.restored_step} "
              f"{o.save_seconds:.2f}s/{o.seconds:.2f}s")
    for o in bad:
        print(f"  {o.trial.crash_at or f'kill after {o.trial.kill_after_s:.3f}s'}: {o.violation}")
    if args.out:
        _write_report(args.out, outs, " ".join(["python -m iobench.checkpointing.crash", *(argv or sys.argv[1:])]))
    return 1 if bad else 0


def _write_report(out: str, outs: list[Outcome], cmd: str) -> None:
    import platform

    rows = [{"trial": o.trial.crash_at or f"kill after {o.trial.kill_after_s:.3f} s", "mode": o.trial.mode,
             "signal": o.signal, "committed_before_kill": o.committed, "restored_step": o.restored_step,
             "violation": o.violation} for o in outs]
    named = [o for o in outs if o.trial.crash_at]
    summary = {"command": cmd, "trials": len(outs), "named_point_trials": len(named),
               "random_time_trials": len(outs) - len(named),
               "killed": sum(o.signal == signal.SIGKILL for o in outs),
               "violations": sum(1 for o in outs if o.violation),
               "machine": f"{os.cpu_count()} CPUs, {platform.system()} {platform.release()}, shared with other work",
               "trials_detail": rows}
    Path(out + ".json").parent.mkdir(parents=True, exist_ok=True)
    Path(out + ".json").write_text(json.dumps(summary, indent=1) + "\n")
    lines = ["# Checkpoint crash campaign\n", f"Command: `{cmd}` on {summary['machine']}.\n",
             f"{summary['trials']} trials ({summary['named_point_trials']} at named points, "
             f"{summary['random_time_trials']} at random times), {summary['killed']} saver processes SIGKILLed, "
             f"**{summary['violations']} violations** (a restore older than a reported commit, a step never saved, "
             f"or wrong bytes).\n", "| trial | mode | committed before kill | restored |", "|---|---|---|---|"]
    for r in rows[:len(named)]:
        lines.append(f"| {r['trial']} | {r['mode']} | {r['committed_before_kill']} | {r['restored_step']} |")
    Path(out + ".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
