"""Hostile values for every numeric, duration and rate flag of every command, generated from the parsers.

Each row runs the command as a user would type it (``iobench.cli.main``, in-process: the refusals
happen before any work, in milliseconds) with one bad value and asserts: exit 2, exactly one line on
stderr, naming the flag, no traceback, done within a few seconds (pytest-timeout).  The rows come from
the argparse parsers themselves (``iobench.bounds.numeric_actions`` and the DURATION/RATE/SPEC flags),
so a flag added later is covered without a line here: a numeric one is held to its bound in
``iobench.bounds`` (or the default one), a duration or rate one needs a base command line below (the
test of the table fails until it has one).

Values: huge (1e20 and 1e400), negative, NaN, inf, zero where the bound excludes it, and for durations
and rates a bare number (no unit, no number: "give a unit: 180ms"), a value past the 7-day cap, a
negative one.  Plus SIGTERM rows for gen, load, check, stage and ckpt: exit 143 with one line, nothing
left behind (no temp file, no scratch dataset, no child process).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hostile_helpers import assert_refused, run_inprocess, snapshot
from iobench.bounds import bound_of, numeric_actions
from iobench.cli import build_parser, main

pytestmark = pytest.mark.timeout(30)

PARSER = build_parser()


def _placeholders(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> list[str]:
    """The command words plus a value for each required positional and option: enough to parse."""
    argv = list(path)
    node = PARSER
    for word in path:   # walk down to the command's own parser
        sub = next(a for a in node._actions if isinstance(a, argparse._SubParsersAction))
        node = sub.choices[word]
    for a in node._actions:
        if isinstance(a, argparse._SubParsersAction) or a.option_strings and not a.required:
            continue
        if a.option_strings:
            argv += [a.option_strings[-1], "1" if a.type in (int, float) else "placeholder"]
        elif a.choices:
            continue   # an optional positional choice (ckpt save|restore): its default
        else:
            argv.append("placeholder")
    return argv


def _numeric_rows():
    for cmd, flag, action in numeric_actions(PARSER):
        bound = bound_of(cmd, flag)
        values = {"huge": "1e20" if action.type is float else "100000000000000000000", "negative": "-1",
                  "nan": "nan", "inf": "inf", "overflow": "1e400"}
        if bound.lo > 0 or bound.lo_open:
            values["zero"] = "0"
        for what, v in values.items():
            yield pytest.param(cmd, flag, v, id=f"{cmd}:{flag}={what}")


def _one_line_naming(err: str, flag: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    _names(lines[0], flag)


def _names(line: str, flag: str) -> None:
    key = flag.lstrip("-")
    assert any(k in line for k in (flag, key, key.replace("-", "_"))), line


@pytest.mark.parametrize("cmd, flag, value", list(_numeric_rows()))
def test_numeric_flag_refuses_hostile_value(cmd, flag, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run_inprocess([*_placeholders(PARSER, tuple(cmd.split())), f"{flag}={value}"], timeout_s=5)
    assert_refused(r, within_s=5)   # exit 2, one stderr line, no traceback, no hang
    _names(r.stderr_lines[0], flag)
    assert not any(tmp_path.iterdir()), "a refused command wrote something"


def test_every_numeric_flag_is_covered():
    flags = {(c, f) for c, f, _ in numeric_actions(PARSER)}
    assert len(flags) >= 60   # the parsers changed shape if this drops: the walk missed them


def test_every_numeric_flag_has_its_own_bound():
    """The default bound (0 to a billion) keeps a new flag from being unbounded; its own says what
    makes sense (a fraction, a process count, a duration): add it to iobench.bounds.FLAGS."""
    from iobench.bounds import FLAGS

    missing = sorted(f"{c} {f}" for c, f, _ in numeric_actions(PARSER) if (c, f) not in FLAGS)
    assert not missing, f"numeric flags without a bound in iobench/bounds.py: {missing}"


# ---- durations, rates and specs: parsed where the command reads them, still before any work

def _text_flags():
    """(command, flag, kind) of every DURATION / RATE / emulation / compute flag the parsers have."""
    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, path + (name,))
            elif a.option_strings and a.type is None:
                flag = max(a.option_strings, key=len)
                kind = {"DURATION": "duration", "RATE": "rate"}.get(a.metavar or "")
                if flag in ("--emulate", "--compute"):
                    kind = flag[2:]
                elif flag == "--runtime":
                    kind = "duration"
                elif flag.endswith(("-ms", "-s")):   # a number with its unit in the flag's name (--compute-ms)
                    kind = "number"
                if kind:
                    yield " ".join(path), flag, kind
    return sorted(set(walk(PARSER, ())))


HOSTILE_TEXT = {
    "duration": {"bare": "180", "past-cap": "99999999h", "negative": "-5ms", "overflow": "1e400s", "nan": "nanms"},
    "rate": {"bare": "200", "negative": "-5MB/s", "overflow": "1e400MB/s", "words": "fast"},
    "emulate": {"bare": "const:180", "past-cap": "const:999999h", "bare-bw": "bw:200", "negative": "const:-1ms"},
    "number": {"huge": "1e20", "negative": "-1", "nan": "nan", "inf": "inf", "words": "fast"},
    "compute": {"bare": "180", "past-cap": "999999999h", "bare-normal": "normal:mean=180,std=20",
                "negative": "-5ms"},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny dataset and two results files, for the commands that read them before their flags."""
    from iobench.generate import GenSpec, generate

    d = tmp_path_factory.mktemp("hostile")
    generate(GenSpec.from_mapping({"num_samples": 16, "seq_len": 16, "shard_size": "8 samples"}), str(d / "ds"),
             progress=False)
    for name in ("a.json", "b.json"):
        assert main(["verify", str(d / "ds"), "--json", str(d / name)]) == 0
    return d


def _base(cmd: str, w: Path) -> list[str]:
    ds = str(w / "ds")
    return {
        "check": ["check", str(w / "scratch")],
        "load": ["load", ds],
        "ckpt": ["ckpt", "--params", "1e6", "--local", str(w / "l"), "--durable", str(w / "d")],
        "compare": ["compare", str(w / "a.json"), str(w / "b.json")],
        "report": ["report", str(w / "a.json"), "-o", str(w / "rep")],
        "gds probe": ["gds", "probe", ds + "/manifest.json"],
        "gds bench": ["gds", "bench", ds + "/manifest.json"],
        "mlperf run": ["mlperf", "run", ds],
        "probe file": ["probe", "file", str(w / "probe")],
        "smoke": ["smoke", "--bucket", "iobench", "--endpoint-url", "http://127.0.0.1:1"],
        "probe s3": ["probe", "s3", "s3://iobench/probe", "--endpoint-url", "http://127.0.0.1:1"],
    }[cmd]


def _text_rows():
    for cmd, flag, kind in _text_flags():
        for what, v in HOSTILE_TEXT[kind].items():
            yield pytest.param(cmd, flag, v, id=f"{cmd}:{flag}={what}")


@pytest.mark.parametrize("cmd, flag, value", list(_text_rows()))
def test_duration_and_rate_flags_refuse_hostile_values(cmd, flag, value, world, tmp_path):
    argv = _base(cmd, world)
    if cmd == "check":
        argv = [*argv, "--step-time", "10ms"] if flag != "--step-time" else argv
    before = snapshot(world)
    r = run_inprocess([*argv, f"{flag}={value}"], timeout_s=5)
    assert_refused(r, within_s=5)
    _names(r.stderr_lines[0], flag)
    if value in ("180", "200", "const:180", "bw:200"):
        assert "unit" in r.stderr, r.stderr
    assert snapshot(world) == before   # nothing written, replaced or created


# ---- --endpoint-url: checked before any work by every command that takes it ------------------

def _endpoint_commands():
    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, path + (name,))
            elif "--endpoint-url" in a.option_strings:
                yield " ".join(path)
    return sorted(set(walk(PARSER, ())))


def _endpoint_base(cmd: str, w: Path) -> list[str]:
    ds = str(w / "ds")
    return {
        "check": ["check", str(w / "scratch"), "--step-time", "10ms"], "load": ["load", ds], "verify": ["verify", ds],
        "ckpt": ["ckpt", "--params", "1e6", "--local", str(w / "l"), "--durable", str(w / "d")],
        "gen": ["gen", "--num-samples", "8", "--out", str(w / "new")], "index": ["index", ds],
        "stage": ["stage", ds, "--tiers", str(w / "none.yaml")], "smoke": ["smoke", "--bucket", "iobench"],
        "tiers init": ["tiers", "init", "--nvme", str(w / "n"), "--out", str(w / "t.yaml")],
        "mlperf run": ["mlperf", "run", ds], "probe file": ["probe", "file", str(w / "probe")],
        "probe metadata": ["probe", "metadata", str(w / "probe")],
        "probe smallfiles": ["probe", "smallfiles", str(w / "probe")], "probe s3": ["probe", "s3", "s3://b/p"],
        "probe all": ["probe", "all", str(w / "probe")],
    }[cmd]


HOSTILE_ENDPOINTS = {"credentials": "http://AKIAHOSTILE:S3CRETPW@127.0.0.1:1", "port": "http://127.0.0.1:99999",
                     "scheme": "ftp://127.0.0.1:21", "empty": "", "no host": "http://:9000"}


@pytest.mark.parametrize("cmd", _endpoint_commands())
@pytest.mark.parametrize("what", list(HOSTILE_ENDPOINTS))
def test_endpoint_url_is_checked_before_work(cmd, what, world):
    # `tiers init --endpoint-url http://KEY:SECRET@...` wrote the secret into the tiers file: the URL is
    # checked in iobench.cli before any command runs, whether or not it ever connects
    before = snapshot(world)
    r = run_inprocess([*_endpoint_base(cmd, world), "--endpoint-url", HOSTILE_ENDPOINTS[what]], timeout_s=5)
    assert_refused(r, "--endpoint-url", within_s=5)
    assert "S3CRETPW" not in r.stdout + r.stderr
    assert snapshot(world) == before


def test_every_text_flag_has_a_base_command(world):
    for cmd, _flag, _kind in _text_flags():
        _base(cmd, world)   # KeyError: a new command with a duration/rate flag needs a base line above


@pytest.mark.parametrize("argv, field", [
    (["mlperf", "run", "DS", "--accelerators", "100000"], "--accelerators"),
    (["ckpt", "--params", "1e15", "--local", "L", "--durable", "D"], "--params"),
    (["ckpt", "--params", "1e6", "--interval-ms", "1e14", "--local", "L", "--durable", "D"], "--interval-ms"),
    (["check", "--step-time", "99999999h", "X"], "--step-time"),
    (["check", "--step-time", "180", "X"], "--step-time"),
    (["load", "DS", "--compute", "999999999h"], "--compute"),
    (["load", "DS", "--emulate", "const:999999h"], "--emulate"),
    (["gen", "--num-samples", "1e11", "--out", "X"], "--num-samples"),   # 372 TiB: more than the disk holds
])
def test_the_reported_cases(argv, field, world, capsys):
    argv = [str(world / "ds") if a == "DS" else str(world / a) if a in ("L", "D", "X") else a for a in argv]
    assert main(argv) == 2
    _one_line_naming(capsys.readouterr().err, field)
    assert not (world / "L").exists() and not (world / "D").exists() and not (world / "X").exists()


# ---- SIGTERM: handled exactly like Ctrl-C

def _iobench(*argv: str) -> list[str]:
    return [sys.executable, "-m", "iobench.cli", *argv]


def _children_of(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith(".tmp")
                  or p.name.startswith("iobench-check-"))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A dataset that takes a while to read at 20 ms a step (the runs are killed long before the end)."""
    from iobench.generate import GenSpec, generate

    d = tmp_path_factory.mktemp("sigterm-ds")
    generate(GenSpec.from_mapping({"num_samples": 4096, "seq_len": 256, "shard_size": "512 samples"}),
             str(d / "ds"), progress=False)
    return d / "ds"


def _sigterm_cases(tmp: Path, big: Path) -> dict[str, list[str]]:
    tiers = tmp / "tiers.yaml"
    return {
        "gen": ["gen", "--out", str(tmp / "out"), "--num-samples", "2000000", "--seq-len", "2048", "--no-progress"],
        "load": ["load", str(big), "--steps", "100000", "--compute", "20ms", "-W", "2"],
        "check": ["check", str(tmp), "--step-time", "20ms", "--steps", "100000", "--samples", "200000",
                  "--sample-size", "64KiB"],
        "stage": ["stage", str(big), "--tiers", str(tiers), "--epochs", "100000", "--no-progress"]
        if "--no-progress" in _flags_of("stage") else ["stage", str(big), "--tiers", str(tiers), "--epochs", "100000"],
        "ckpt": ["ckpt", "--params", "2e8", "--scale", "1", "--count", "1000", "--interval-ms", "200",
                 "--local", str(tmp / "local"), "--durable", str(tmp / "durable")],
    }


def _flags_of(cmd: str) -> set[str]:
    sub = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
    return {s for a in sub.choices[cmd]._actions for s in a.option_strings}


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ["gen", "load", "check", "stage", "ckpt"])
def test_sigterm_is_handled_like_ctrl_c(name, big, tmp_path):
    if name == "stage":
        assert main(["tiers", "init", "--nvme", str(tmp_path / "nvme"), "--pfs", str(tmp_path / "pfs"),
                     "--out", str(tmp_path / "tiers.yaml")]) == 0
    argv = _sigterm_cases(tmp_path, big)[name]
    p = subprocess.Popen(_iobench(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path, start_new_session=True)
    try:
        time.sleep(3.0)   # well into the work: workers started, files being written
        assert p.poll() is None, f"{name} ended before the signal: {p.communicate()}"
        kids = _children_of(p.pid)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 143, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert "terminated" in last and "SIGTERM" in last, err[-2000:]
    assert _leftovers(tmp_path) == []
    if name == "gen":
        assert not (tmp_path / "out").exists()   # the directory it made, empty again: removed too
    deadline = time.monotonic() + 10
    import psutil

    while time.monotonic() < deadline and any(psutil.pid_exists(k) and psutil.Process(k).status() != "zombie"
                                              for k in kids):
        time.sleep(0.2)
    assert not [k for k in kids if psutil.pid_exists(k) and psutil.Process(k).status() != "zombie"]


# A signal's exception raised inside a fork hook is "Exception ignored" by Python: a SIGTERM that hit
# gen while it forked its writers was lost and the run finished, exit 0.  The handler's exception goes
# to sys.unraisablehook, which sends the signal again to be raised where it can be.
_SWALLOWED = """
import os, signal, sys, time
from iobench import cli
cli._sigterm_like_sigint()
def hook():
    os.kill(os.getpid(), signal.{sig})   # its handler runs here, inside the fork hook, where it cannot raise
    time.sleep(0.01)
os.register_at_fork(after_in_parent=hook)
try:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    for _ in range(200):
        time.sleep(0.01)
    print("LOST")
except KeyboardInterrupt as e:
    print(type(e).__name__)
"""


@pytest.mark.parametrize("sig, raised", [("SIGTERM", "Terminated"), ("SIGINT", "KeyboardInterrupt")])
def test_a_signal_swallowed_in_a_fork_hook_is_delivered_again(sig, raised):
    r = subprocess.run([sys.executable, "-c", _SWALLOWED.format(sig=sig)], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == raised, (r.stdout, r.stderr[-1000:])
    assert "Exception ignored" not in r.stderr, r.stderr[-1000:]


@pytest.mark.parametrize("exc, rc", [("Terminated", 143), ("KeyboardInterrupt", 130)])
def test_a_signal_before_the_command_starts_is_one_line(exc, rc, monkeypatch, capsys):
    # SIGTERM while the parser is built (imports of every command module: the first 0.2-0.6 s on a busy
    # host) was a Terminated traceback, exit 1
    import iobench.cli as cli

    def interrupted():
        raise getattr(cli, exc, None) or KeyboardInterrupt()

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["version"]) == rc
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_cancelled_rate_limiter_wakes_its_sleepers_at_once():
    import threading

    from iobench.io.ratelimit import Cancelled, RateLimiter

    lim = RateLimiter(1.0)            # 1 B/s: a 1000-byte transfer would sleep 1000 s
    got: list[BaseException] = []

    def move():
        try:
            lim.consume(1000)
        except Cancelled as e:
            got.append(e)

    t = threading.Thread(target=move)
    t.start()
    time.sleep(0.2)
    lim.cancel()
    t.join(timeout=5)
    assert not t.is_alive() and got


@pytest.mark.timeout(90)
def test_sigterm_cuts_a_throttled_checkpoint_upload_short(tmp_path):
    # 14 MB per save at --durable-bw 1MB: the upload in progress held SIGTERM for 28 s
    argv = ["ckpt", "--params", "1e6", "--count", "50", "--interval-ms", "200", "--durable-bw", "1MB",
            "--local", str(tmp_path / "l"), "--durable", str(tmp_path / "d"), "--no-progress"]
    p = subprocess.Popen(_iobench(*argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not list((tmp_path / "d").glob("step-*")):
            time.sleep(0.05)      # an upload has begun
        assert p.poll() is None, p.communicate()
        p.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        out, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 143, err[-2000:]
    assert took < 10, f"SIGTERM took {took:.1f} s"   # (cut short: well under the 14 s one upload needs)
    assert not [s for s in (tmp_path / "d").glob("step-*") if not (s / "manifest.json").exists()]   # no half step


# a value checked where the config is built is reported under its config key (gen.format); the line
# names the flag the user typed too, so that the one line names the field as typed
CONFIG_KEY_ROWS = [
    (["gen", "--out", "{t}/g", "--format", "bogus"], "--format"),
    (["gen", "--out", "{t}/g", "--compression", "zstd:99"], "--compression"),
    (["gen", "--out", "{t}/g", "--compression", "zstd:abc"], "--compression"),
    (["gen", "--out", "{t}/g", "--checksum", "md5"], "--checksum"),
    (["gen", "--out", "{t}/g", "--token-dtype", "float32"], "--token-dtype"),
    (["gen", "--out", "{t}/g", "--shard-size", "0 samples"], "--shard-size"),
    (["gen", "--out", "{t}/g", "--distribution", "cauchy"], "--distribution"),
    (["gen", "--out", "{t}/g", "--modality", "smells"], "--modality"),
    (["probe", "file", "{t}/p", "--rw", "bogus"], "--rw"),
    (["probe", "file", "{t}/p", "--engine", "bogus"], "--engine"),
    (["probe", "file", "{t}/p", "--io", "sideways"], "--io"),
    (["tiers", "init", "--nvme", "{t}/n", "--nvme-capacity", "-1", "--out", "{t}/t.yaml"], "--nvme-capacity"),
    (["tiers", "init", "--nvme", "{t}/n", "--pfs", "{t}/p", "--pfs-capacity", "lots", "--out", "{t}/t.yaml"],
     "--pfs-capacity"),
]


@pytest.mark.parametrize("argv, flag", CONFIG_KEY_ROWS, ids=[" ".join(a[:2] + a[-2:]) for a, _ in CONFIG_KEY_ROWS])
def test_a_config_key_error_names_the_flag_that_was_typed(argv, flag, tmp_path):
    r = run_inprocess([a.format(t=tmp_path) for a in argv], timeout_s=10)
    assert_refused(r, flag, within_s=10)
    assert f"error: {flag} (" in r.stderr_lines[0], r.stderr_lines[0]
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_larger_than_memory_is_refused_before_any_directory(tmp_path, capsys):
    rc = main(["ckpt", "--params", "1e12", "--local", str(tmp_path / "l"), "--durable", str(tmp_path / "d")])
    err = capsys.readouterr().err
    assert rc == 2 and "memory" in err
    _one_line_naming(err, "--params")
    assert not (tmp_path / "l").exists() and not (tmp_path / "d").exists()


# ---- manifests: fields out of type or range are field errors (exit 2), not CORRUPT (exit 1)

MANIFEST_EDITS = {
    "format": (lambda d: d.update(format="bogus"), "manifest.format"),
    "modality": (lambda d: d.update(modality="smells"), "manifest.modality"),
    "compression": (lambda d: d.update(compression="lzma:9"), "manifest.compression"),
    "algorithm": (lambda d: d["shards"][0].update(checksum="md7:00"), "manifest.shards[0].checksum"),
    "total_samples": (lambda d: d.update(total_samples=-1), "manifest.total_samples"),
    "total_bytes": (lambda d: d.update(total_bytes="many"), "manifest.total_bytes"),
    "seq_len": (lambda d: d["spec"].update(seq_len=0), "manifest.spec.seq_len"),
    "vocab_size": (lambda d: d["spec"].update(vocab_size=-3), "manifest.spec.vocab_size"),
    "samples>bytes": (lambda d: d["shards"][0].update(samples=10**15), "manifest.shards[0].samples"),
    "huge shard": (lambda d: (d["shards"][0].update(samples=10**15, bytes=10**15), d.pop("total_samples"),
                              d.pop("total_bytes"), [s.pop("first_sample") for s in d["shards"]]),
                   "manifest.total_samples"),   # (first_sample left out: consistent in every other way)
    "offsets": (lambda d: d["shards"][0].update(offsets=[0, 1]), "manifest.shards[0].offsets"),
    # hostile25: accepted (or a traceback) before
    "seq_len past memory": (lambda d: d["spec"].update(seq_len=10**15), "manifest.spec.seq_len"),   # ENOMEM
    "token_dtype": (lambda d: d["spec"].update(token_dtype="float128"), "manifest.spec.token_dtype"),
    "first_sample": (lambda d: d["shards"][1].update(first_sample=99), "manifest.shards[1].first_sample"),
    "no shards": (lambda d: d.update(shards=[]), "manifest.shards"),
    "shard is the manifest": (lambda d: d["shards"][0].update(path="manifest.json"), "manifest.shards[0].path"),
    "name too long": (lambda d: d["shards"][0].update(path="a" * 5000), "manifest.shards[0].path"),
    "zstd level": (lambda d: d.update(compression="zstd:99"), "manifest.compression"),
}


@pytest.mark.parametrize("command", ["verify", "load", "check"])
@pytest.mark.parametrize("edit", list(MANIFEST_EDITS))
def test_manifest_fields_out_of_range_are_field_errors(edit, command, world, tmp_path, capsys):
    import json
    import shutil

    ds = tmp_path / "ds"
    shutil.copytree(world / "ds", ds)
    d = json.loads((ds / "manifest.json").read_text())
    fn, field = MANIFEST_EDITS[edit]
    fn(d)
    (ds / "manifest.json").write_text(json.dumps(d))
    before = {p.name: p.read_bytes() for p in ds.iterdir()}
    argv = {"verify": ["verify", str(ds)], "load": ["load", str(ds), "--steps", "2"],
            "check": ["check", "--dataset", str(ds), "--step-time", "10ms"]}[command]
    t0 = time.monotonic()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and field in err and "Traceback" not in err, err
    assert time.monotonic() - t0 < 5
    assert {p.name: p.read_bytes() for p in ds.iterdir()} == before


# ---- the probes' list flags (VALUE: "1,4,32"): every one with hostile items, refused before any probe

# sizes a probe takes as "at most": the test file is capped by --size, a shard rotation past the dataset
# is one shard (documented; still refused when negative, NaN or unreadable)
CAPPED_BY_DESIGN = {("file", "--file-size"), ("smallfiles", "--shard-size")}


def _probe_value_rows():
    sub = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction))
    probe = sub.choices["probe"]
    psub = next(a for a in probe._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in psub.choices.items():
        for a in p._actions:
            if a.option_strings and a.metavar == "VALUE":
                flag = max(a.option_strings, key=len)
                for what, v in {"huge": "1e15", "negative": "-1", "nan": "nan", "overflow": "1e400",
                                "bare-list": "1,1e15"}.items():
                    if what in ("huge", "bare-list") and (name, flag) in CAPPED_BY_DESIGN:
                        continue
                    yield pytest.param(name, flag, v, id=f"probe {name}:{flag}={what}")


@pytest.mark.parametrize("probe, flag, value", list(_probe_value_rows()))
def test_probe_list_flags_refuse_hostile_values(probe, flag, value, tmp_path):
    target = ["s3://iobench/probe", "--endpoint-url", "http://127.0.0.1:1"] if probe == "s3" else [str(tmp_path / "p")]
    r = run_inprocess(["probe", probe, *target, f"{flag}={value}"], timeout_s=10)
    assert_refused(r, within_s=10)
    assert not (tmp_path / "p").exists()


def test_slots_made_before_a_signal_are_unlinked(monkeypatch):
    # SIGTERM 1 s into `check` (the loader setting up) left "3 leaked shared_memory objects" for the
    # resource tracker, and its warning lines after the one line
    import multiprocessing as mp
    from multiprocessing import shared_memory

    from iobench.loader import slots

    real, made = shared_memory.SharedMemory, []

    def interrupted_at_the_third(*a, **kw):
        if len(made) == 2:
            raise KeyboardInterrupt()
        shm = real(*a, **kw)
        made.append(shm.name)
        return shm

    monkeypatch.setattr(shared_memory, "SharedMemory", interrupted_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        slots.SlotPool(mp.get_context("fork"), 4, 4096)
    monkeypatch.undo()
    for name in made:
        with pytest.raises(FileNotFoundError):
            shared_memory.SharedMemory(name=name)
