"""The second hostile pass (issue 25, by someone who did not write the guard): the classes it found open,
each generated over its cases.

- Checkpoint retention owned directories by name: any ``step-NNNNNNNNNNNN`` directory on a tier was
  its own, so a user's files in one, or a directory holding someone else's ``manifest.json``, were
  deleted by rotation; and a foreign ``step-999999999999`` made iobench's own newest step look old.
  Now only the files iobench writes in a step directory go (``commit_point.written_here``), a step
  is committed only by an iobench checkpoint manifest, and the directory goes only when empty.
- Numbers that reach the loader through ``--set`` (``load.steps``, ``load.epochs``) were bounded only by
  planning epoch after epoch (seconds on a tiny dataset, hours on a large one); ``load.prefetch`` was
  blamed on ``--workers``.
- A credential in ``--storage-option`` was quoted by the KEY=VALUE error and not masked elsewhere;
  a traceback inside a log record (``log.exception``) was not masked.
"""

from __future__ import annotations

import logging
import os

import pytest
from hostile_helpers import assert_refused, make_user_file, run_inprocess, snapshot

from iobench.results import redact_text

# ---- checkpoint retention: only iobench's own files ---------------------------------------

# what a user may have put on a checkpoint tier, under a name retention looks at
FOREIGN_STEPS = {
    "user file in an old step dir": {"step-000000000001/notes.txt": "mine\n"},
    "foreign manifest.json": {"step-000000000002/manifest.json": '{"mine": 1}\n',
                              "step-000000000002/weights.pt": "w\n"},
    "foreign manifest, huge step": {"step-999999999999/manifest.json": '{"mine": 2}\n'},
    "a rank-named file beside the user's": {"step-000000000003/rank-00000.bin": "not iobench's?\n",
                                            "step-000000000003/README": "mine\n"},
    "nested directory": {"step-000000000004/sub/data.txt": "mine\n"},
}


@pytest.mark.parametrize("tier", ["local", "durable"])
@pytest.mark.parametrize("case", list(FOREIGN_STEPS))
def test_checkpoint_rotation_never_deletes_what_iobench_did_not_write(case, tier, tmp_path):
    from iobench.checkpointing.commit_point import list_steps, holds_own_manifest
    from iobench.storage import open_backend

    local, durable = tmp_path / "local", tmp_path / "durable"
    for d in (local, durable):
        d.mkdir()
    victims = []
    for rel, text in FOREIGN_STEPS[case].items():
        victims.append(make_user_file(tmp_path / tier / rel, text))
    keep = {rel.split("/")[0] for rel in FOREIGN_STEPS[case]
            if not rel.endswith("rank-00000.bin")}   # a rank file beside the user's README may go; the README stays
    before = snapshot(*[v for v in victims if not v.endswith("rank-00000.bin")])
    r = run_inprocess(["ckpt", "--params", "1e5", "--count", "3", "--interval-ms", "1", "--keep-local", "1",
                       "--keep-durable", "1", "--local", str(local), "--durable", str(durable)], timeout_s=60)
    assert r.rc == 0, r.stderr
    assert snapshot(*[v for v in victims if not v.endswith("rank-00000.bin")]) == before
    for d in keep:
        assert (tmp_path / tier / d).is_dir()
    # rotation still works on iobench's own steps: exactly one of its own is kept on each tier
    for d in (local, durable):
        b = open_backend(str(d))
        own = [s for s in list_steps(b) if holds_own_manifest(b, s)]
        assert len(own) == 1, (d, sorted(os.listdir(d)))
    r = run_inprocess(["ckpt", "restore", "--params", "1e5", "--local", str(local), "--durable", str(durable)],
                      timeout_s=60)
    assert r.rc == 0, r.stderr


def test_retention_removes_its_own_leftovers_and_keeps_the_directory_of_foreign_files(tmp_path):
    from iobench.checkpointing.commit_point import remove_own_files
    from iobench.storage import open_backend

    d = tmp_path / "step-000000000007"
    make_user_file(d / "rank-00000.bin", "x")
    make_user_file(d / ".rank-00001.bin.abcdef-1-2-abcd.tmp", "x")
    make_user_file(d / "mine.txt")
    remove_own_files(open_backend(str(tmp_path)), 7)
    assert sorted(os.listdir(d)) == ["mine.txt"]
    os.unlink(d / "mine.txt")
    make_user_file(d / "rank-00000.bin", "x")
    remove_own_files(open_backend(str(tmp_path)), 7)
    assert not d.exists()


# ---- numbers through --set: refused from the first epoch, naming the field ----------------

@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    d = tmp_path_factory.mktemp("pass2") / "ds"
    r = run_inprocess(["gen", "--format", "raw", "--num-samples", "64", "--seq-len", "32", "--shard-size", "1KiB",
                       "--out", str(d), "--no-progress"], timeout_s=60)
    assert r.rc == 0, r.stderr
    return d


SET_ROWS = [("load.steps", v) for v in ("1000000000", "1000000000000000", str(2**62))] + \
           [("load.epochs", v) for v in ("1000000", "1000000000000")] + \
           [("load.prefetch", v) for v in ("100000", "1000000000")]


@pytest.mark.parametrize("key, value", SET_ROWS)
def test_set_values_are_bounded_before_work(key, value, ds):
    before = snapshot(ds)
    r = run_inprocess(["load", str(ds), "--set", f"{key}={value}"], timeout_s=10)
    field = {"load.prefetch": "--prefetch"}.get(key, key)
    assert_refused(r, field, within_s=5)
    assert snapshot(ds) == before


# ---- secrets: storage options and tracebacks in log records ------------------------------

SO_SECRET = "SO-secret-value-0123456789"


@pytest.mark.parametrize("argv", [
    ["--storage-option", f"secret:{SO_SECRET}"],                  # mistyped: the value quoted as a bad option
    [f"--storage-option=secret{SO_SECRET}"],                     # no separator at all
    ["--storage-option", f"secret={SO_SECRET}", "--storage-option", "bogus"],
    ["--storage-option", f"client_kwargs.aws_secret_access_key={SO_SECRET}", "--storage-option", "x"],
], ids=["colon", "no-sep", "good-then-bad", "nested-key"])
@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
def test_a_storage_option_secret_reaches_no_output(argv, debug, capfd):
    from iobench.cli import main

    try:
        rc = main((["--debug"] if debug else []) + ["verify", "s3://iobench/x", "--endpoint-url",
                                                     "http://127.0.0.1:9"] + argv)
    except Exception as e:   # --debug re-raises: what the interpreter would print is the exception's text
        rc = None
        assert SO_SECRET not in redact_text(str(e))
    out, err = capfd.readouterr()
    assert SO_SECRET not in out + err
    if not debug:
        assert rc == 2 and len([ln for ln in err.splitlines() if ln.strip()]) == 1, err


def test_a_traceback_in_a_log_record_is_masked(tmp_path):
    from iobench.cli import _mask_secrets_in_logs
    from iobench.results import register_secret

    secret = "log-traceback-SECRET-42"
    register_secret(secret)
    _mask_secrets_in_logs()
    log = logging.getLogger("iobench.test.pass2")
    path = tmp_path / "log.txt"
    handler = logging.FileHandler(path)
    log.addHandler(handler)
    try:
        try:
            raise RuntimeError(f"cannot reach http://AK:{secret}@127.0.0.1:1 with {secret}")
        except RuntimeError:
            log.exception("upload failed")
        log.warning("where", stack_info=True)
    finally:
        log.removeHandler(handler)
        handler.close()
    text = path.read_text()
    assert "RuntimeError" in text and "upload failed" in text
    assert secret not in text


# ---- tier copy directories: reconcile and the next stage remove only what a stager writes ---------

# files a user may leave beside iobench's copies, in the copy directory iobench made
COPY_DIR_USER_FILES = {"notes": "mine.txt", "nested": "sub/x.txt", "old-style temp name": ".notes.backup12.tmp",
                       "a temp name standing for no shard": ".thesis.tex.aaaaaaaa.tmp",
                       "a shard name the dataset lacks": "shard-000099.bin"}


@pytest.mark.parametrize("command", ["reconcile", "stage", "evict"])
@pytest.mark.parametrize("case", list(COPY_DIR_USER_FILES))
def test_a_users_file_in_a_copy_directory_survives(case, command, ds, tmp_path):
    tiers = tmp_path / "tiers.yaml"
    assert run_inprocess(["tiers", "init", "--nvme", str(tmp_path / "nvme"), "--pfs", str(tmp_path / "pfs"),
                          "--out", str(tiers)], timeout_s=30).rc == 0
    r = run_inprocess(["stage", str(ds), "--tiers", str(tiers)], timeout_s=30)
    assert r.rc == 0, r.stderr
    (copy_dir,) = [d for d in (tmp_path / "nvme").iterdir() if d.name.startswith("ds-")]
    victim = make_user_file(copy_dir / COPY_DIR_USER_FILES[case])
    # what a killed stager leaves, which must still go: the temp file of a dead writer for a real shard
    shard = sorted(p.name for p in copy_dir.iterdir() if p.name.startswith("shard-0000"))[0]
    leftover = make_user_file(copy_dir / f".{shard}.zzzzzzzz.tmp", "half")
    before = snapshot(victim)
    argv = {"reconcile": ["tiers", "reconcile", "--tiers", str(tiers)],
            "stage": ["stage", str(ds), "--tiers", str(tiers)],
            "evict": ["tiers", "evict", "--tiers", str(tiers), "--tier", "nvme"]}[command]
    r = run_inprocess(argv, timeout_s=30)
    assert r.rc == 0, r.stderr
    assert snapshot(victim) == before
    if command != "evict":
        assert not os.path.exists(leftover)


# ---- compare and the results reader: two different commands, results of the wrong shape ---------

def _results(path, doc) -> str:
    import json

    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("doc, field", [
    ({"schema_version": 1, "command": 5}, "results"),
    ({"schema_version": 1, "command": None}, "results"),
    ({"schema_version": 1, "command": "load", "metrics": "fast"}, "metrics"),
    ({"schema_version": 1, "command": "load", "metrics": [1, 2]}, "metrics"),
    ({"schema_version": 1, "command": "load", "config": 7}, "config"),
    ({"schema_version": 1, "command": "load", "environment": [1]}, "environment"),
    ({"schema_version": 1, "command": "load", "host": "x"}, "host"),
    ({"schema_version": 1, "command": "load", "world": 3}, "world"),
    ({"schema_version": 1, "command": "load", "warnings": {"a": 1}}, "warnings"),
    ({"schema_version": 1, "command": "load", "per_rank": "x"}, "per_rank"),
    ({"schema_version": 1, "command": "load"}, "no metrics"),
    ({"schema_version": 1, "command": "load", "metrics": None}, "no metrics"),
], ids=["command-int", "command-null", "metrics-str", "metrics-list", "config-int", "environment-list", "host-str",
        "world-int", "warnings-dict", "per_rank-str", "metrics-missing", "metrics-null"])
@pytest.mark.parametrize("reader", ["compare", "report", "plan"])
def test_results_of_the_wrong_shape_are_refused(doc, field, reader, ds, tmp_path):
    bad = _results(tmp_path / "bad.json", doc)
    good = str(tmp_path / "good.json")
    assert run_inprocess(["verify", str(ds), "--json", good], timeout_s=30).rc == 0
    argv = {"compare": ["compare", bad, good], "report": ["report", bad, "-o", str(tmp_path / "rep")],
            "plan": ["plan", "prefetch", "--from", bad]}[reader]
    before = snapshot(tmp_path)
    assert_refused(run_inprocess(argv, timeout_s=10), field, within_s=5)
    assert snapshot(tmp_path) == before


def test_compare_refuses_results_of_two_different_commands(ds, tmp_path):
    a, b = str(tmp_path / "load.json"), str(tmp_path / "verify.json")
    assert run_inprocess(["load", str(ds), "--steps", "4", "--json", a], timeout_s=60).rc == 0
    assert run_inprocess(["verify", str(ds), "--json", b], timeout_s=30).rc == 0
    r = run_inprocess(["compare", a, b], timeout_s=10)
    assert_refused(r, "command load vs verify")
    assert run_inprocess(["compare", a, b, "--allow-different"], timeout_s=10).rc == 0


# ---- a workload section no command reads (`laod:`) was ignored: the run used the defaults ---------

@pytest.mark.parametrize("text, field", [
    ("laod:\n  batch_size: 4\n", "'laod'"), ("gen: {}\nchekpoint: {}\n", "'chekpoint'"),
    ("a: &a [1, 1, 1]\nb: [*a, *a, *a]\nload: {batch_size: 4}\n", "'a'"),   # an alias bomb's anchors
], ids=["laod", "chekpoint", "anchors"])
@pytest.mark.parametrize("command", ["load", "gen"])
def test_a_workload_section_no_command_reads_is_refused(text, field, command, ds, tmp_path):
    wl = tmp_path / "wl.yaml"
    wl.write_text(text)
    argv = {"load": ["load", str(ds), "--workload", str(wl)],
            "gen": ["gen", "--workload", str(wl), "--out", str(tmp_path / "never")]}[command]
    assert_refused(run_inprocess(argv, timeout_s=10), field, within_s=5)
    assert not (tmp_path / "never").exists()


# ---- smoke interrupted: its scratch prefix goes too, and the checkpoint threads stop first ---------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("after", ["PASS verify dataset", "PASS read with stall measurement"])
def test_smoke_interrupted_removes_its_scratch_prefix(after, s3_server, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import s3fs

    prefix = f"pass2-{after.split()[1]}-{os.getpid()}"
    env = dict(os.environ, **s3_server.env())
    p = subprocess.Popen([sys.executable, "-m", "iobench.cli", "smoke", "--endpoint-url", s3_server.endpoint_url,
                          "--bucket", s3_server.bucket, "--prefix", prefix, "--steps", "3"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    err = ""
    try:
        assert p.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            err += line
            if not line or after in line:
                break
        assert after in err, err
        p.send_signal(signal.SIGTERM)
        _, rest = p.communicate(timeout=60)
        err += rest
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert p.returncode == 143, err[-2000:]
    assert "Traceback" not in err and "terminated (SIGTERM)" in err.strip().splitlines()[-1], err[-2000:]
    fs = s3fs.S3FileSystem(endpoint_url=s3_server.endpoint_url, key=env.get("AWS_ACCESS_KEY_ID"),
                           secret=env.get("AWS_SECRET_ACCESS_KEY"))
    root = f"{s3_server.bucket}/{prefix}"
    left = [k for k in fs.find(root) if k.rstrip("/") != root]
    assert left == []


# ---- an empty path (an unset shell variable) and a name longer than the file system allows ---------

LONG = "n" * 300
PATH_ROWS = {
    "verify --json": (["verify", "{ds}", "--json", "{P}"], "--json"),
    "load --json": (["load", "{ds}", "--steps", "2", "--json", "{P}"], "--json"),
    "gen --out": (["gen", "--num-samples", "8", "--out", "{P}"], "--out"),
    "index --out": (["index", "{ds}", "--format", "raw", "--out", "{P}"], "--out"),
    "report -o": (["report", "{res}", "-o", "{P}"], "--out"),
    "compare --markdown": (["compare", "{res}", "{res}", "--markdown", "{P}"], "--markdown"),
    "load --workload": (["load", "{ds}", "--workload", "{P}"], "--workload"),
    "verify DATASET": (["verify", "{P}"], "DATASET"),
}


@pytest.mark.parametrize("kind", ["empty", "too long"])
@pytest.mark.parametrize("name", list(PATH_ROWS))
def test_an_empty_or_overlong_path_is_refused(name, kind, ds, tmp_path):
    res = str(tmp_path / "res.json")
    assert run_inprocess(["verify", str(ds), "--json", res], timeout_s=30).rc == 0
    argv, field = PATH_ROWS[name]
    if kind == "too long" and name in ("load --workload", "verify DATASET"):
        pytest.skip("an input: a missing file, reported as such")
    value = "" if kind == "empty" else str(tmp_path / (LONG + ".json"))
    before = snapshot(tmp_path, ds)
    r = run_inprocess([a.format(ds=ds, res=res, P=value) if "{" in a else a for a in argv], timeout_s=10)
    assert_refused(r, field, within_s=5)
    assert snapshot(tmp_path, ds) == before


# ---- a tiers file's numbers hold the flags' bounds (iobench.bounds) ------------------------------

@pytest.mark.parametrize("key, value", [("concurrency", "100000000"), ("concurrency", "-1"), ("concurrency", ".nan"),
                                        ("retries", "100000"), ("retries", "0"), ("retries", "-1")])
def test_a_tiers_files_numbers_are_bounded(key, value, ds, tmp_path):
    t = tmp_path / "tiers.yaml"
    t.write_text(f"tiers:\n- name: nvme\n  url: {tmp_path / 'nvme'}\n{key}: {value}\n")
    before = snapshot(tmp_path, ds)
    assert_refused(run_inprocess(["stage", str(ds), "--tiers", str(t)], timeout_s=10), key, within_s=5)
    assert snapshot(tmp_path, ds) == before


# ---- the cache directory: iobench's own files there are read through the input reader too -------

@pytest.mark.parametrize("kind", ["fifo", "not JSON", "nested 100000 deep", "a list"])
def test_an_unusable_cache_entry_is_rebuilt_never_waited_on(kind, ds, tmp_path, monkeypatch):
    # a FIFO at the cache's host-ceiling.json blocked `load` in open() forever (> 20 s)
    from hostile_helpers import make_fifo

    cache = tmp_path / "cache"
    cache.mkdir()
    entry = cache / "host-ceiling.json"
    if kind == "fifo":
        make_fifo(entry)
    else:
        entry.write_text({"not JSON": "{oops", "nested 100000 deep": "[" * 100_000, "a list": "[1, 2]"}[kind])
    monkeypatch.setenv("IOBENCH_CACHE_DIR", str(cache))
    r = run_inprocess(["load", str(ds), "--steps", "2", "-B", "4", "-W", "0", "--host-ceiling", "cached",
                       "--no-progress"], timeout_s=60)
    assert r.rc == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr


# ---- roots given as URLs: one place under two spellings is the same root -----------------------

@pytest.mark.parametrize("a, b, same", [
    ("s3://b/x", "s3a://b/x", True), ("s3://b/x", "S3://b/x", True), ("memory://m", "memory:///m", True),
    ("memory://m/a", "memory:///m", True), ("s3://b/x", "s3://b/x/y", True), ("s3://b/x/", "s3://b/x", True),
    ("s3://b/x", "s3://b/xy", False), ("s3://b/x", "s3://b//x", False),   # another key prefix in S3
    ("s3://b/x", "s3://c/x", False),
])
def test_tier_urls_that_name_one_place_overlap(a, b, same):
    from iobench.errors import ConfigError
    from iobench.tiers.config import tiers_from_mapping

    doc = {"catalog": "/tmp/never.sqlite", "tiers": [{"name": "a", "url": a}, {"name": "b", "url": b}]}
    if same:
        with pytest.raises(ConfigError, match="tiers.b.url"):
            tiers_from_mapping(doc)
    else:
        tiers_from_mapping(doc)
