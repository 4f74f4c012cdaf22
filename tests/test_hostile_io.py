"""Hostile paths, generated: every output flag at every input its command reads, every input
flag given a FIFO / directory / non-UTF-8 file, catalogs that are not SQLite, FIFOs in place of
shards and manifests, symlinks out of an indexed root, `gen` onto the user's directories and
tier / checkpoint roots that overlap.

The rows are generated from the declarations below (``COMMANDS``: a command, its output flags,
the inputs it reads; ``INPUT_FLAGS``: where each input flag goes in a command line; ``READERS``:
the commands that read a dataset, a catalog or a tiers file).  Every row runs ``iobench``
in-process under a SIGALRM deadline and asserts: exit 2, exactly one stderr line (naming the
flag or the hostile file), no traceback, within seconds, and the whole world byte-identical
(every file hashed before and after; FIFOs recorded by kind, never opened).  A few rows check
that what must work still does (``gen --force`` beside the user's files, lifecycle over a tier
holding the user's files), leaving every user byte as it was.
"""

from __future__ import annotations

import json
import os

import pytest
from hostile_helpers import (assert_refused, make_fifo, make_non_sqlite, make_non_utf8, make_user_file,
                             run_inprocess, run_subprocess, snapshot)

DEADLINE_S = 8.0

# ---- the world every row runs against -----------------------------------------------------


class World:
    def __init__(self, base: str):
        self.base = base
        p = self.p = {"base": base}

        def at(key: str, *rel: str) -> str:
            p[key] = os.path.join(base, *rel)
            return p[key]

        ok = run_inprocess(["gen", "--format", "raw", "--num-samples", "64", "--seq-len", "32", "--shard-size",
                            "1KiB", "--out", at("ds", "ds"), "--no-progress"], timeout_s=60)
        assert ok.rc == 0, ok.stderr
        shards = sorted(n for n in os.listdir(p["ds"]) if n.startswith("shard-"))
        p["shard"] = shards[0]
        # ways to name a dataset's files without naming them: a symlink to one, to the root, '..'
        os.makedirs(at("links", "links"))
        os.symlink(os.path.join(p["ds"], "manifest.json"), at("link_manifest", "links", "manifest-link.json"))
        os.symlink(p["ds"], at("link_ds", "links", "ds-link"))
        for name in ("a", "b"):
            r = run_inprocess(["verify", p["ds"], "--json", at(f"res_{name}", "res", f"{name}.json")], timeout_s=60)
            assert r.rc == 0, r.stderr
        # the user's things: never to be replaced or deleted
        make_user_file(at("notes", "user", "notes.txt"))
        make_user_file(at("foreign_json", "user", "data.json"), '{"a": 1}\n')
        make_user_file(at("wl", "user", "workload.yaml"), "load:\n  batch_size: 4\n")
        make_user_file(at("cfg", "user", "cluster.yaml"), "probes: {}\n")
        make_user_file(at("steps", "user", "steps.txt"), "1ms\n2ms\n")
        make_user_file(at("rep_html", "user", "rep1", "report.html"), "<html>my own page</html>\n")
        make_user_file(at("rep_md", "user", "rep2", "report.md"), "# my notes\n")
        p["rep1"], p["rep2"] = os.path.dirname(p["rep_html"]), os.path.dirname(p["rep_md"])
        for n in ("a.bin", "b.bin"):
            make_user_file(os.path.join(at("ds2", "ds2"), n), f"user data {n}\n")
        with open(at("trace", "res", "trace.jsonl"), "w") as f:
            f.write(json.dumps({"type": "header", "version": 1, "dataset": "x"}) + "\n")
            for i in range(4):
                f.write(json.dumps({"type": "read", "t": i * 0.1, "pid": 1, "shard": f"s{i % 2}", "bytes": 100,
                                    "result": "miss"}) + "\n")
        # tiers: nvme bounded, pfs unbounded (the default catalog goes there)
        at("nvme", "nvme")
        at("pfs", "pfs")
        make_user_file(os.path.join(p["nvme"], "scratch.txt"))
        make_user_file(os.path.join(p["nvme"], "project", "main.py"), "print('mine')\n")
        make_user_file(os.path.join(p["pfs"], "scratch.txt"))
        self.tiers_file("tiers", [("nvme", p["nvme"], "1MiB"), ("pfs", p["pfs"], None)])
        r = run_inprocess(["tiers", "show", "--tiers", p["tiers"]], timeout_s=60)
        assert r.rc == 0, r.stderr
        p["catalog"] = os.path.join(p["pfs"], ".iobench", "catalog.sqlite")
        assert os.path.exists(p["catalog"])
        os.makedirs(at("local", "ckpt", "local"))
        os.makedirs(at("durable", "ckpt", "durable"))
        for nested in (("durable", "local"), ("local", "step-000000000001"), ("local", "d")):   # restore reads them
            os.makedirs(os.path.join(p[nested[0]], nested[1]))
        # hostile files
        make_fifo(at("fifo", "hostile", "pipe.yaml"))
        make_fifo(at("fifo_json", "hostile", "pipe.json"))
        os.makedirs(at("dir", "hostile", "dir.yaml"))
        os.makedirs(at("dir_json", "hostile", "dir.json"))
        make_non_utf8(at("bad", "hostile", "latin1.yaml"))
        make_non_utf8(at("bad_json", "hostile", "latin1.json"))
        make_non_utf8(at("bad_txt", "hostile", "latin1.txt"))
        make_non_sqlite(at("notsql", "hostile", "notsql.sqlite"))
        import sqlite3   # the user's own SQLite database given as a catalog: refused before anything writes to it

        db = sqlite3.connect(at("userdb", "hostile", "users.sqlite"))
        db.executescript("CREATE TABLE users(name TEXT); INSERT INTO users VALUES ('ada');")
        db.commit()
        db.close()
        make_user_file(at("wl_list", "hostile", "list.yaml"), "load: [1, 2]\ngen: 5\n")   # sections not mappings
        for name, data in (("a.tar", "x" * 15), ("b.tar", "")):   # no samples in any file
            make_user_file(os.path.join(at("idx_nosamples", "idx_nosamples"), name), data)
        # nested 100 000 deep: the parsers recurse per level (a RecursionError slipped past `except ValueError`)
        make_user_file(at("deep", "hostile", "deep.yaml"), "[" * 100_000)
        make_user_file(at("deep_json", "hostile", "deep.json"), "[" * 100_000)
        make_user_file(at("empty", "hostile", "empty.yaml"), "")
        # 4 GiB of NUL bytes (sparse): past every size cap, and one 4 GiB "line" for a line reader; kept
        # outside base so that the per-row snapshot never hashes it
        for key, name in (("giant", "giant.yaml"), ("giant_json", "giant.json")):
            p[key] = os.path.join(os.path.dirname(base), os.path.basename(base) + "-giant", name)
            os.makedirs(os.path.dirname(p[key]), exist_ok=True)
            with open(p[key], "wb") as f:
                f.truncate(4 << 30)
        os.makedirs(at("dircat", "hostile", "catalog.d"))
        for kind, cat in (("fifo", p["fifo"]), ("dir", p["dircat"]), ("notsql", p["notsql"]), ("userdb", p["userdb"])):
            self.tiers_file(f"tiers_cat_{kind}", [("nvme", p["nvme"], "1MiB"), ("pfs", p["pfs"], None)], catalog=cat)
        # overlapping tier roots
        n, q = p["nvme"], p["pfs"]
        self.tiers_file("tiers_same", [("nvme", n, "1MiB"), ("pfs", n, None)])
        self.tiers_file("tiers_same_url", [("nvme", n, "1MiB"), ("pfs", "file://" + n, None)])
        self.tiers_file("tiers_nested", [("nvme", os.path.join(q, "hot"), "1MiB"), ("pfs", q, None)])
        self.tiers_file("tiers_nested2", [("nvme", n, "1MiB"), ("pfs", os.path.join(n, "below"), None)])
        self.tiers_file("tiers_null", [("nvme", None, "1MiB"), ("pfs", q, None)])
        self.tiers_file("tiers_empty", [("nvme", "", "1MiB"), ("pfs", q, None)])
        self.tiers_file("tiers_endpoint_creds", [("nvme", n, "1MiB"), ("pfs", q, None)],
                        extra={"endpoint_url": "http://AKIAHOSTILE:S3CRETPW@127.0.0.1:1"})
        self.tiers_file("tiers_options_str", [("nvme", n, "1MiB"), ("pfs", q, None)], extra={"storage_options": "x"})
        # datasets with a hostile member
        for key, what in (("ds_fifo_shard", "fifo"), ("ds_dir_shard", "dir")):
            self.copy_ds(key)
            target = os.path.join(p[key], p["shard"])
            os.unlink(target)
            make_fifo(target) if what == "fifo" else os.makedirs(target)
        for key, what in (("ds_fifo_manifest", "fifo"), ("ds_dir_manifest", "dir"), ("ds_bad_manifest", "bad"),
                          ("ds_loop_manifest", "loop")):
            self.copy_ds(key)
            target = os.path.join(p[key], "manifest.json")
            os.unlink(target)
            {"fifo": make_fifo, "dir": os.makedirs, "bad": make_non_utf8,
             "loop": lambda t: os.symlink(t, t)}[what](target)
        for key in ("idx_fifo", "idx_link", "idx_linkdir"):
            make_user_file(os.path.join(at(key, key), "a.bin"))
        for ext in ("bin", "tar"):
            make_fifo(os.path.join(p["idx_fifo"], f"b.{ext}"))
            os.symlink("/etc/passwd", os.path.join(p["idx_link"], f"passwd.{ext}"))
        os.symlink("/etc", os.path.join(p["idx_linkdir"], "etc"))
        # gen onto the user's directories
        make_user_file(os.path.join(at("gen_user", "gen", "user"), "thesis.tex"))
        make_user_file(os.path.join(at("gen_usermanifest", "gen", "usermanifest"), "manifest.json"), '{"mine": 1}\n')
        make_user_file(os.path.join(at("gen_usershard", "gen", "usershard"), "shard-000000.bin"), "mine\n")
        make_user_file(os.path.join(at("gen_indexed", "gen", "indexed"), "photo.jpg"), "jpeg bytes\n")
        r = run_inprocess(["index", p["gen_indexed"], "--format", "files", "--modality", "images"], timeout_s=60)
        assert r.rc == 0, r.stderr

    def tiers_file(self, key: str, tiers: list, catalog: str | None = None, extra: dict | None = None) -> None:
        import yaml

        doc: dict = {"tiers": [{"name": n, "url": u, **({"capacity": c} if c else {}), **(extra or {})}
                               for n, u, c in tiers]}
        if catalog:
            doc["catalog"] = catalog
        path = self.p[key] = os.path.join(self.base, "tiers", f"{key}.yaml")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            yaml.safe_dump(doc, f)

    def copy_ds(self, key: str) -> None:
        import shutil

        self.p[key] = os.path.join(self.base, "bad-ds", key)
        shutil.copytree(self.p["ds"], self.p[key])

    def fill(self, argv: list[str]) -> list[str]:
        return [a.format(**self.p) for a in argv]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return World(str(tmp_path_factory.mktemp("hostile-io")))


# ---- declarations the rows are generated from ----------------------------------------------

DS_VICTIMS = ["{ds}", "{ds}/manifest.json", "{ds}/{shard}", "{ds}/new.json", "{link_manifest}", "{link_ds}/{shard}",
              "{ds}/../ds/manifest.json"]
TIER_VICTIMS = ["{tiers}", "{nvme}", "{nvme}/scratch.txt", "{nvme}/new.json", "{pfs}/new.json", "{catalog}"]

# command line, its output flags, the inputs it reads (each output flag is pointed at each)
COMMANDS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "verify": (["verify", "{ds}"], ["--json"], DS_VICTIMS),
    "load": (["load", "{ds}", "--tiers", "{tiers}", "--workload", "{wl}", "--compute", "file:{steps}"], ["--json"],
             DS_VICTIMS + TIER_VICTIMS + ["{wl}", "{steps}"]),
    "check": (["check", "--dataset", "{ds}", "--step-time", "1ms"], ["--json"], DS_VICTIMS),
    "stage": (["stage", "{ds}", "--tiers", "{tiers}"], ["--json", "--trace"], DS_VICTIMS + TIER_VICTIMS),
    "mlperf run": (["mlperf", "run", "{ds}"], ["--json", "--checkpoint-folder"], DS_VICTIMS),
    "gds bench": (["gds", "bench", "{ds}"], ["--json"], DS_VICTIMS),
    "index": (["index", "{ds2}", "--format", "files", "--modality", "records"], ["--json"],
              ["{ds2}", "{ds2}/a.bin", "{ds2}/new.json"]),
    "compare": (["compare", "{res_a}", "{res_b}"], ["--json", "--markdown"], ["{res_a}", "{res_b}"]),
    "plan": (["plan", "prefetch", "--from", "{res_a}"], ["--json"], ["{res_a}"]),
    "report": (["report", "{res_a}", "{res_b}"], ["-o"], ["{res_a}"]),
    "tiers show": (["tiers", "show", "--tiers", "{tiers}"], ["--json"], TIER_VICTIMS),
    "tiers lifecycle": (["tiers", "lifecycle", "--tiers", "{tiers}", "--hot", "pfs", "--archive", "nvme",
                         "--keep-last", "1"], ["--json"], TIER_VICTIMS),
    "tiers simulate": (["tiers", "simulate", "{trace}"], ["--json"], ["{trace}"]),
    "tiers init": (["tiers", "init", "--nvme", "{nvme}", "--pfs", "{pfs}"], ["--out"],
                   ["{nvme}/t.yaml", "{pfs}/t.yaml", "{nvme}"]),
    "ckpt": (["ckpt", "--params", "1e6", "--count", "1", "--local", "{local}", "--durable", "{durable}"],
             ["--json"], ["{local}", "{local}/new.json", "{durable}", "{durable}/new.json"]),
    "ckpt restore": (["ckpt", "restore", "--params", "1e6", "--local", "{local}", "--durable", "{durable}"],
                     ["--json"], ["{local}/new.json", "{durable}/new.json"]),
    "gen": (["gen", "--workload", "{wl}", "--out", "{base}/newds"], ["--json"],
            ["{wl}", "{base}/newds/manifest.json"]),
    "smoke": (["smoke", "--endpoint-url", "http://127.0.0.1:9", "--bucket", "b"], ["--json", "--junit"], []),
    "run": (["run", "--config", "{cfg}"], ["--out"], ["{cfg}"]),
    "mlperf ckpt": (["mlperf", "ckpt", "--out", "{local}", "--scale", "1e-6"], ["--json"],
                    ["{local}", "{local}/new.json"]),
    "mlperf datasize": (["mlperf", "datasize", "--client-memory", "1GiB"], ["--json"], []),
    "probe file": (["probe", "file", "{base}/probe-target", "--quick"], ["--json"], []),
    "gds probe": (["gds", "probe"], ["--json"], []),
}

# input flag -> (command line with {IN} where the hostile path goes, what the error names besides the file)
INPUT_FLAGS: dict[str, list[str]] = {
    "load --workload": ["load", "{ds}", "--workload", "{IN}"],
    "gen --workload": ["gen", "--workload", "{IN}", "--out", "{base}/never"],
    "load --tiers": ["load", "{ds}", "--tiers", "{IN}"],
    "stage --tiers": ["stage", "{ds}", "--tiers", "{IN}"],
    "tiers show --tiers": ["tiers", "show", "--tiers", "{IN}"],
    "tiers evict --tiers": ["tiers", "evict", "--tiers", "{IN}", "--tier", "nvme"],
    "tiers reconcile --tiers": ["tiers", "reconcile", "--tiers", "{IN}"],
    "tiers lifecycle --tiers": ["tiers", "lifecycle", "--tiers", "{IN}", "--hot", "pfs", "--archive", "nvme",
                                "--keep-last", "1"],
    "run --config": ["run", "--config", "{IN}", "--out", "{base}/never"],
    "load --compute file:": ["load", "{ds}", "--compute", "file:{IN}"],
    "plan --from": ["plan", "prefetch", "--from", "{IN}"],
    "report RESULTS": ["report", "{IN}", "-o", "{base}/never"],
    "compare A": ["compare", "{IN}", "{res_b}"],
    "compare B": ["compare", "{res_a}", "{IN}"],
    "tiers simulate TRACE": ["tiers", "simulate", "{IN}"],
    "gds bench FILE": ["gds", "bench", "{IN}"],
}
HOSTILE_KINDS = {"fifo": ("fifo", "fifo_json"), "directory": ("dir", "dir_json"),
                 "non-UTF-8": ("bad", "bad_json"), "nested 100000 deep": ("deep", "deep_json"),
                 "4 GiB sparse": ("giant", "giant_json")}
TEXT_KINDS = ("non-UTF-8", "nested 100000 deep", "4 GiB sparse")   # what only a text reader refuses
NOT_TEXT = {"gds bench FILE"}   # reads bytes: only the kinds of file matter

# flags that name a directory (a root, a work or output directory): a FIFO or a regular file there
DIR_FLAGS: dict[str, tuple[list[str], str]] = {
    "ckpt --local": (["ckpt", "--params", "1e6", "--count", "1", "--local", "{IN}"], "--local"),
    "ckpt --durable": (["ckpt", "--params", "1e6", "--count", "1", "--durable", "{IN}"], "--durable"),
    "ckpt restore --local": (["ckpt", "restore", "--params", "1e6", "--local", "{IN}"], "--local"),
    "ckpt restore --durable": (["ckpt", "restore", "--params", "1e6", "--durable", "{IN}"], "--durable"),
    "tiers init --nvme": (["tiers", "init", "--nvme", "{IN}", "--out", "{base}/never.yaml"], "--nvme"),
    "probe file URL": (["probe", "file", "{IN}", "--quick"], "URL"),
    "check TARGET": (["check", "{IN}", "--step-time", "1ms"], "TARGET"),
    "gen --out": (["gen", "--num-samples", "8", "--seq-len", "8", "--out", "{IN}"], "--out"),
    "report -o": (["report", "{res_a}", "-o", "{IN}"], "--out"),
    "run --out": (["run", "--out", "{IN}", "--stages", "probe"], "--out"),
    "mlperf ckpt --out": (["mlperf", "ckpt", "--out", "{IN}"], "--out"),
    "mlperf run --checkpoint-folder": (["mlperf", "run", "{ds}", "--checkpoint-folder", "{IN}"], "--checkpoint-folder"),
}

# commands that read a dataset / a tiers file (and its catalog), with {DS} / {T} placeholders
DATASET_READERS: dict[str, list[str]] = {
    "verify": ["verify", "{DS}"],
    "load": ["load", "{DS}", "--steps", "2"],
    "check --dataset": ["check", "--dataset", "{DS}", "--step-time", "1ms", "--steps", "2"],
    "stage": ["stage", "{DS}", "--tiers", "{tiers}"],
    "gds bench": ["gds", "bench", "{DS}", "--paths", "cpu"],
    "mlperf run": ["mlperf", "run", "{DS}", "--runs", "1", "--no-checkpoint"],
}
BAD_DATASETS = ["ds_fifo_shard", "ds_dir_shard", "ds_fifo_manifest", "ds_dir_manifest", "ds_bad_manifest",
                "ds_loop_manifest"]
TIERS_READERS: dict[str, list[str]] = {
    "tiers show": ["tiers", "show", "--tiers", "{T}"],
    "tiers evict": ["tiers", "evict", "--tiers", "{T}", "--tier", "nvme"],
    "tiers reconcile": ["tiers", "reconcile", "--tiers", "{T}"],
    "tiers lifecycle": ["tiers", "lifecycle", "--tiers", "{T}", "--hot", "nvme", "--archive", "pfs", "--keep-last", "1"],
    "stage": ["stage", "{ds}", "--tiers", "{T}"],
    "load --tiers": ["load", "{ds}", "--tiers", "{T}", "--steps", "2"],
}
BAD_CATALOGS = ["tiers_cat_fifo", "tiers_cat_dir", "tiers_cat_notsql", "tiers_cat_userdb"]
OVERLAPPING_TIERS = {"tiers_same": "is the same directory as", "tiers_same_url": "is the same directory as",
                     "tiers_nested": "inside", "tiers_nested2": "inside", "tiers_null": "url",
                     "tiers_empty": "url", "tiers_endpoint_creds": "endpoint_url",
                     "tiers_options_str": "storage_options"}


def _rows():
    rows = []
    # 1. every output flag at every input of its command
    for name, (argv, outs, victims) in COMMANDS.items():
        for flag in outs:
            for v in victims:
                rows.append(pytest.param(argv + [flag, v], flag, id=f"out-on-input:{name} {flag} {v}"))
    # 2. every output file flag at a file iobench did not write (a note; JSON that is no results file)
    for name, (argv, outs, _) in COMMANDS.items():
        for flag in outs:
            if flag in ("-o", "--checkpoint-folder") or (flag == "--out" and name != "tiers init"):
                continue
            for foreign in ("{notes}", "{foreign_json}"):
                rows.append(pytest.param(argv + [flag, foreign], flag, id=f"foreign-file:{name} {flag} {foreign}"))
    rows.append(pytest.param(COMMANDS["report"][0] + ["-o", "{rep1}"], "-o", id="foreign-file:report own report.html"))
    rows.append(pytest.param(COMMANDS["report"][0] + ["-o", "{rep2}"], "-o", id="foreign-file:report own report.md"))
    for d in ("{rep1}", "{rep2}"):
        rows.append(pytest.param(["run", "--out", d, "--stages", "probe"], "--out", id=f"foreign-file:run --out {d}"))
    # 2b. --force replaces iobench's own files, never a data file of the command's input
    rows.append(pytest.param(["index", "{ds2}", "--format", "files", "--modality", "records", "--out", "{ds2}/a.bin",
                              "--force"], "--out", id="force-never-over-data:index --out a data file --force"))
    rows.append(pytest.param(["verify", "{ds}", "--json", "{ds}/{shard}", "--force"], "--json",
                             id="force-never-over-data:verify --json a shard --force"))
    # 3. two outputs at one path
    for name, (argv, outs, _) in COMMANDS.items():
        if len(outs) > 1 and "--checkpoint-folder" not in outs:
            rows.append(pytest.param(argv + [outs[0], "{base}/same.out", outs[1], "{base}/same.out"], outs[1],
                                     id=f"two-outputs:{name}"))
    # 4. hostile input files: FIFO, directory, non-UTF-8
    for name, argv in INPUT_FLAGS.items():
        for kind, (yaml_key, json_key) in HOSTILE_KINDS.items():
            if kind in TEXT_KINDS and name in NOT_TEXT:
                continue
            key = json_key if any(w in name for w in ("RESULTS", "compare", "plan")) else yaml_key
            if name == "load --compute file:" and kind == "non-UTF-8":
                key = "bad_txt"
            rows.append(pytest.param([a.replace("{IN}", "{%s}" % key) for a in argv], "@" + key,
                                     id=f"input:{name} is a {kind}"))
    for name in ("load --workload", "gen --workload"):   # an empty workload: asked for one, silently got none
        rows.append(pytest.param([a.replace("{IN}", "{empty}") for a in INPUT_FLAGS[name]], "@empty",
                                 id=f"input:{name} is empty"))
        rows.append(pytest.param([a.replace("{IN}", "{wl_list}") for a in INPUT_FLAGS[name]], "must map",
                                 id=f"input:{name} section is a list"))
    # 4b. a FIFO or a regular file where a directory goes; a FIFO where an output file goes
    for name, (argv, field) in DIR_FLAGS.items():
        for key in ("fifo", "notes"):
            rows.append(pytest.param([a.replace("{IN}", "{%s}" % key) for a in argv], field,
                                     id=f"dir-flag:{name} is a {key}"))
    for name, (argv, outs, _) in COMMANDS.items():
        for flag in outs:
            if flag not in ("-o", "--checkpoint-folder") and (flag != "--out" or name == "tiers init"):
                rows.append(pytest.param(argv + [flag, "{fifo_json}"], flag, id=f"out-is-fifo:{name} {flag}"))
    # 5. catalogs that are a FIFO, a directory, not SQLite
    for name, argv in TIERS_READERS.items():
        for t in BAD_CATALOGS:
            rows.append(pytest.param([a.replace("{T}", "{%s}" % t) for a in argv], "catalog", id=f"catalog:{name} {t}"))
    # 6. datasets with a FIFO or directory for a shard or manifest, a non-UTF-8 manifest
    for name, argv in DATASET_READERS.items():
        for d in BAD_DATASETS:
            rows.append(pytest.param([a.replace("{DS}", "{%s}" % d) for a in argv], None, id=f"dataset:{name} {d}"))
    # 7. index: FIFO among the data files, symlinks out of the root
    for d, formats in (("idx_fifo", ("files", "tar")), ("idx_link", ("files", "tar")), ("idx_linkdir", ("files",))):
        for fmt in formats:
            rows.append(pytest.param(["index", "{%s}" % d, "--format", fmt, "--modality", "records"], "dataset file",
                                     id=f"index:{d} --format {fmt}"))
    rows.append(pytest.param(["gds", "bench", "{empty}", "--paths", "cpu"], "empty", id="input:gds bench FILE is empty"))
    for key in ("empty", "wl"):   # an empty cluster config (the suite ran on defaults); a key the suite has not
        rows.append(pytest.param(["run", "--config", "{%s}" % key, "--out", "{base}/never"], "--config",
                                 id=f"input:run --config {key}"))
    for cat in ("notsql", "userdb", "notes"):   # tiers init names a catalog no command could open
        rows.append(pytest.param(["tiers", "init", "--nvme", "{nvme}", "--catalog", "{%s}" % cat, "--out",
                                  "{base}/never.yaml"], "--catalog", id=f"input:tiers init --catalog {cat}"))
    for extra in ([], ["--format", "tar"], ["--out", "{base}/never.json"]):   # files that hold no sample
        rows.append(pytest.param(["index", "{idx_nosamples}", *extra], "no samples",
                                 id=f"index:no samples {' '.join(extra)}"))
    # 8. overlapping tier roots, for every command that reads a tiers file
    for name, argv in TIERS_READERS.items():
        for t, needle in OVERLAPPING_TIERS.items():
            rows.append(pytest.param([a.replace("{T}", "{%s}" % t) for a in argv], needle, id=f"tier-roots:{name} {t}"))
    # 9. checkpoint roots the same or nested, either way, for save and restore
    for action in ("save", "restore"):
        for local, durable in (("{local}", "{local}"), ("{local}", "{local}/step-000000000001"),
                               ("{durable}/local", "{durable}"), ("{local}", "file://{local}/d")):
            rows.append(pytest.param(["ckpt", action, "--params", "1e6", "--count", "1", "--local", local,
                                      "--durable", durable], "--", id=f"ckpt-roots:{action} {local} {durable}"))
    # 10. gen onto the user's directories, with and without --force
    for d in ("gen_user", "gen_usermanifest", "gen_usershard", "gen_indexed"):
        rows.append(pytest.param(["gen", "--num-samples", "8", "--seq-len", "8", "--out", "{%s}" % d, "--no-progress"],
                                 "--out", id=f"gen-onto-user:{d}"))
    for d in ("gen_usermanifest", "gen_usershard", "gen_indexed"):
        rows.append(pytest.param(["gen", "--num-samples", "8", "--seq-len", "8", "--out", "{%s}" % d, "--no-progress",
                                  "--force"], "--out", id=f"gen-onto-user --force:{d}"))
    return rows


ROWS = _rows()


@pytest.mark.parametrize("argv,field", ROWS)
def test_hostile_path_is_refused_and_nothing_changes(world, argv, field):
    args = world.fill(argv)
    before = snapshot(world.base)
    r = run_inprocess(args, timeout_s=DEADLINE_S)
    after = snapshot(world.base)
    if field is not None and field.startswith("@"):   # the line names the hostile file itself
        field = os.path.basename(world.p[field[1:]])
    assert_refused(r, field, within_s=DEADLINE_S)
    assert "S3CRETPW" not in r.stdout + r.stderr, r.stderr   # (tiers_endpoint_creds' password)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    assert not changed, f"changed by a refused command: {changed[:5]}"


def test_there_are_enough_rows():
    assert len(ROWS) >= 200, len(ROWS)


# ---- what must still work, leaving the user's bytes alone -----------------------------------

def test_gen_force_writes_beside_the_users_files_without_touching_them(world):
    d = os.path.join(world.base, "gen", "beside")
    make_user_file(os.path.join(d, "thesis.tex"))
    make_user_file(os.path.join(d, "figs", "plot.png"), "png\n")
    before = snapshot(os.path.join(d, "thesis.tex"), os.path.join(d, "figs"))
    argv = ["gen", "--num-samples", "8", "--seq-len", "8", "--out", d, "--no-progress"]
    assert_refused(run_inprocess(argv), "--out")
    r = run_inprocess(argv + ["--force"], timeout_s=60)
    assert r.rc == 0, r.stderr
    r = run_inprocess(["gen", "--num-samples", "16", "--seq-len", "8", "--out", d, "--no-progress"], timeout_s=60)
    assert r.rc == 0, r.stderr   # regenerating our own dataset there needs no --force
    assert snapshot(os.path.join(d, "thesis.tex"), os.path.join(d, "figs")) == before
    assert run_inprocess(["verify", d]).rc == 0


def test_lifecycle_without_prefix_never_expires_the_users_files(world):
    user = [os.path.join(world.p["nvme"], "scratch.txt"), os.path.join(world.p["nvme"], "project")]
    before = snapshot(*user)
    r = run_inprocess(["tiers", "lifecycle", "--tiers", world.p["tiers"], "--hot", "nvme", "--archive", "pfs",
                       "--keep-last", "1"], timeout_s=60)
    assert r.rc == 0, r.stderr
    assert snapshot(*user) == before


def test_results_iobench_wrote_are_replaced_without_force(world, tmp_path):
    out = str(tmp_path / "again.json")
    for _ in range(2):
        r = run_inprocess(["verify", world.p["ds"], "--json", out], timeout_s=60)
        assert r.rc == 0, r.stderr
    empty = tmp_path / "mktemp.json"
    empty.write_bytes(b"")
    assert run_inprocess(["verify", world.p["ds"], "--json", str(empty)], timeout_s=60).rc == 0
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert_refused(run_inprocess(["verify", world.p["ds"], "--json", str(notes)]), "--force")
    assert run_inprocess(["verify", world.p["ds"], "--json", str(notes), "--force"], timeout_s=60).rc == 0


def test_a_fifo_shard_does_not_hang_a_loader_with_workers(world):
    # out of process: a hang here would be in worker processes, which SIGALRM cannot reach
    r = run_subprocess(["load", world.p["ds_fifo_shard"], "--workers", "2", "--steps", "2"], timeout_s=30)
    assert_refused(r, "FIFO")


def test_gen_regenerates_its_own_older_dataset_and_never_an_indexed_one(world, tmp_path):
    d = str(tmp_path / "old")
    argv = ["gen", "--num-samples", "8", "--seq-len", "8", "--out", d, "--no-progress"]
    assert run_inprocess(argv, timeout_s=60).rc == 0
    man = os.path.join(d, "manifest.json")
    doc = json.load(open(man))
    del doc["extra"]["generator"]            # as written before gen marked its manifests
    with open(man, "w") as f:
        json.dump(doc, f)
    assert run_inprocess(argv, timeout_s=60).rc == 0          # still recognised as gen's own: no --force
    user = os.path.join(world.p["gen_indexed"], "photo.jpg")
    before = snapshot(world.p["gen_indexed"])
    r = run_inprocess(["gen", "--num-samples", "8", "--seq-len", "8", "--out", world.p["gen_indexed"],
                       "--no-progress", "--force"])
    assert_refused(r, "manifest.json")
    assert snapshot(world.p["gen_indexed"]) == before and os.path.exists(user)


def test_gen_onto_a_users_s3_prefix_overwrites_nothing(s3_server, s3_prefix):
    import s3fs

    fs = s3fs.S3FileSystem(**s3_server.storage_options())
    key = s3_prefix[len("s3://"):]
    fs.pipe(f"{key}/shard-000000.bin", b"the user's object")
    fs.pipe(f"{key}/notes.txt", b"mine")
    from iobench.errors import ConfigError
    from iobench.generate import GenSpec, generate

    spec = GenSpec.from_mapping({"num_samples": 8, "seq_len": 8, "format": "raw"})
    kw = dict(endpoint_url=s3_server.endpoint_url, progress=False,
              storage_options={"key": s3_server.access_key, "secret": s3_server.secret_key})
    with pytest.raises(ConfigError, match="is not empty"):
        generate(spec, s3_prefix, **kw)
    with pytest.raises(ConfigError, match="shard-000000.bin exists and was not written by `iobench gen`"):
        generate(spec, s3_prefix, force=True, **kw)
    fs.rm(f"{key}/shard-000000.bin")
    generate(spec, s3_prefix, force=True, **kw)          # beside the user's object, which stays
    fs.invalidate_cache()
    assert fs.cat(f"{key}/notes.txt") == b"mine"
    generate(spec, s3_prefix, **kw)                      # its own dataset now: regenerated without --force
    assert fs.cat(f"{key}/notes.txt") == b"mine"


def test_tiers_init_replaces_its_own_file_and_refuses_a_handwritten_one(world, tmp_path):
    out = str(tmp_path / "tiers.yaml")
    argv = ["tiers", "init", "--nvme", str(tmp_path / "n"), "--out", out]
    for _ in range(2):
        r = run_inprocess(argv, timeout_s=30)
        assert r.rc == 0, r.stderr
    hand = tmp_path / "mine.yaml"
    hand.write_text("tiers:\n  - {name: nvme, url: /somewhere}\n")
    assert_refused(run_inprocess(argv[:-1] + [str(hand)]), "--force")
    assert hand.read_text().startswith("tiers:")
