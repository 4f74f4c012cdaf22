"""Bad input, command by command: exit 2, exactly one line on stderr, no traceback, nothing created.

A table, run in-process (``iobench.cli.main``) so the whole table costs seconds.  Add a row
with every new flag.  Placeholders: {ds} a small dataset, {file} an existing regular file,
{dir} an existing directory, {tmp} a scratch directory (must stay as it was), {tiers} a valid
tiers file, {yaml_bad} a YAML file with a syntax error, {nofile} a path that does not exist.
"""

from __future__ import annotations

import os

import pytest

from iobench.cli import main

CASES = {
    # gen
    "gen huge num-samples": (["gen", "--num-samples", "99999999999999999999", "--out", "{tmp}/g"], "gen.num_samples"),
    "gen vocab 2^40": (["gen", "--vocab-size", str(2**40), "--out", "{tmp}/g"], "gen.vocab_size"),
    "gen jitter 5": (["gen", "--modality", "images", "--set", "gen.image_size_jitter=5", "--out", "{tmp}/g"],
                     "gen.image_size_jitter"),
    "gen negative workers": (["gen", "--workers", "-1", "--out", "{tmp}/g"], "gen.workers"),
    "gen out is a file": (["gen", "--out", "{file}"], "--out"),
    "gen json is a dir": (["gen", "--out", "{tmp}/g", "--json", "{dir}"], "--json"),
    "gen json in /proc": (["gen", "--out", "{tmp}/g", "--json", "/proc/iobench-x.json"], "--json"),
    "gen json under a file": (["gen", "--out", "{tmp}/g", "--json", "{file}/r.json"], "--json"),
    "gen set other section": (["gen", "--out", "{tmp}/g", "--set", "load.seed=1"], "--set"),
    "gen unknown scheme": (["gen", "--out", "nosuchproto://host/x"], "--out"),
    "gen missing workload": (["gen", "--workload", "{nofile}.yaml", "--out", "{tmp}/g"], "--workload"),
    "gen bad yaml": (["gen", "--workload", "{yaml_bad}", "--out", "{tmp}/g"], "workload"),
    "gen secret endpoint": (["gen", "--out", "s3://b/x", "--endpoint-url", "ftp://KEY:SECRET@h"], "--endpoint-url"),
    # verify
    "verify a file": (["verify", "{file}"], "dataset"),
    "verify missing": (["verify", "{nofile}"], "dataset"),
    "verify json is a dir": (["verify", "{ds}", "--json", "{dir}"], "--json"),
    # load
    "load empty emulate": (["load", "{ds}", "--emulate", ""], "--emulate"),
    "load two latencies": (["load", "{ds}", "--emulate", "pfs+const:1ms"], "--emulate"),
    "load duplicate key": (["load", "{ds}", "--emulate", "normal:mean=1ms,mean=2ms,std=1ms"], "--emulate"),
    "load slot bytes 10": (["load", "{ds}", "--slot-bytes", "10"], "--slot-bytes"),
    "load set gen": (["load", "{ds}", "--set", "gen.seed=1"], "--set"),
    "load staging no tiers": (["load", "{ds}", "--staging", "ondemand"], "--staging"),
    "load workers vs nofile": (["load", "{ds}", "-W", "100000"], "--workers"),
    "load batch > dataset": (["load", "{ds}", "-B", "1000000000"], "--batch-size"),
    "load json is a dir": (["load", "{ds}", "--json", "{dir}"], "--json"),
    "load json in /proc": (["load", "{ds}", "--json", "/proc/iobench-x.json"], "--json"),
    "load compute bad": (["load", "{ds}", "--compute", "bogus"], "--compute"),
    "load compute-ms bad": (["load", "{ds}", "--compute-ms", "x"], "--compute-ms"),
    "load tiers is a dir": (["load", "{ds}", "--tiers", "{dir}"], "--tiers"),
    "load tiers missing": (["load", "{ds}", "--tiers", "{nofile}"], "--tiers"),
    "load a file": (["load", "{file}"], "dataset"),
    "load zero prefetch": (["load", "{ds}", "-Q", "0"], "prefetch"),
    # stage
    "stage tiers is a dir": (["stage", "{ds}", "--tiers", "{dir}"], "--tiers"),
    "stage tiers bad yaml": (["stage", "{ds}", "--tiers", "{yaml_bad}"], "--tiers"),
    "stage trace is a dir": (["stage", "{ds}", "--tiers", "{tiers}", "--trace", "{dir}"], "--trace"),
    "stage unknown tier": (["stage", "{ds}", "--tiers", "{tiers}", "--to", "nvmee"], "--to"),
    # ckpt
    "ckpt local is a file": (["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--local", "{file}",
                              "--durable", "{tmp}/d"], "--local"),
    "ckpt local == durable": (["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--local", "{tmp}/x",
                               "--durable", "{tmp}/x"], "--durable"),
    "ckpt restore missing durable": (["ckpt", "restore", "--durable", "{nofile}"], "--durable"),
    "ckpt json is a dir": (["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--local", "{tmp}/l",
                            "--durable", "{tmp}/d", "--json", "{dir}"], "--json"),
    # tiers
    "tiers init nvme is a file": (["tiers", "init", "--nvme", "{file}", "-o", "{tmp}/t.yaml"], "--nvme"),
    "tiers init out is a dir": (["tiers", "init", "--nvme", "{tmp}/n", "-o", "{dir}"], "--out"),
    "tiers show tiers missing": (["tiers", "show", "--tiers", "{nofile}"], "--tiers"),
    "tiers lifecycle hot == archive": (["tiers", "lifecycle", "--tiers", "{tiers}", "--hot", "nvme", "--archive",
                                        "nvme", "--keep-last", "1"], "--archive"),
    "tiers lifecycle escaping prefix": (["tiers", "lifecycle", "--tiers", "{tiers}", "--hot", "nvme", "--archive",
                                         "object", "--prefix", "../x", "--keep-last", "1"], "--prefix"),
    "tiers unknown scheme": (["tiers", "show", "--tiers", "{tiers_ftp}"], "tiers.object.url"),
    "tiers simulate missing trace": (["tiers", "simulate", "{nofile}"], "TRACE"),
    # probe
    "probe file under /proc": (["probe", "file", "/proc/iobench-x", "--quick"], "URL"),
    "probe file on a file": (["probe", "file", "{file}", "--quick"], "URL"),
    # run / report / compare / plan / gds
    "run config missing": (["run", "--config", "{nofile}", "--out", "{tmp}/r"], "--config"),
    "run out is a file": (["run", "--out", "{file}"], "--out"),
    "report out is a file": (["report", "{file}", "-o", "{file}"], "--out"),
    "compare markdown is a dir": (["compare", "{file}", "{file}", "--markdown", "{dir}"], "--markdown"),
    "plan json is a dir": (["plan", "checkpoint-size", "--json", "{dir}"], "--json"),
    "gds bench json is a dir": (["gds", "bench", "{ds}", "--json", "{dir}"], "--json"),
}


@pytest.fixture(scope="module")
def places(tmp_path_factory):
    from iobench.generate import GenSpec, generate
    from iobench.tiers.config import TiersConfig, TierSpec, write_tiers_file

    base = tmp_path_factory.mktemp("fuzz")
    ds = base / "ds"
    generate(GenSpec.from_mapping({"num_samples": 64, "seq_len": 16, "shard_size": "16 samples"}), str(ds),
             progress=False)
    (base / "file.bin").write_bytes(b"x" * 10)
    (base / "dir").mkdir()
    (base / "bad.yaml").write_text("gen:\n  format: raw\n   modality: [tokens\n")
    cfg = TiersConfig(tiers=(TierSpec("nvme", str(base / "nvme"), capacity="1MiB"),
                             TierSpec("object", str(base / "object"))), catalog=str(base / "catalog.sqlite"))
    write_tiers_file(cfg, str(base / "tiers.yaml"))
    (base / "tiers-ftp.yaml").write_text("tiers:\n  - {name: object, url: 'nosuchproto://KEY:SECRET@host/x'}\n")
    return {"ds": str(ds), "file": str(base / "file.bin"), "dir": str(base / "dir"), "tiers": str(base / "tiers.yaml"), "tiers_ftp": str(base / "tiers-ftp.yaml"),
            "yaml_bad": str(base / "bad.yaml"), "nofile": str(base / "nothing-here"), "base": base}


def _tree(root) -> set[str]:
    out = set()
    for dirpath, dirs, files in os.walk(root):
        for n in dirs + files:
            out.add(os.path.relpath(os.path.join(dirpath, n), root))
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_exit_2_one_line_nothing_created(places, tmp_path, case, capsys, monkeypatch):
    argv, needle = CASES[case]
    monkeypatch.chdir(tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    fill = {**{k: v for k, v in places.items() if k != "base"}, "tmp": str(scratch)}
    argv = [a.format(**fill) for a in argv]
    before_base, before_tmp = _tree(places["base"]), _tree(tmp_path)
    rc = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, f"{case}: exit {rc}: {err}"
    assert len(lines) == 1 and "Traceback" not in err, f"{case}: {err}"
    assert needle in lines[0], f"{case}: {needle!r} not named in {lines[0]!r}"
    assert "SECRET" not in err
    assert _tree(tmp_path) == before_tmp, f"{case}: created {_tree(tmp_path) - before_tmp}"
    assert _tree(places["base"]) == before_base, f"{case}: created {_tree(places['base']) - before_base}"
