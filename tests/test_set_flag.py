"""`--set SECTION.KEY=VALUE` is checked the same way by every command that takes it: a section
the command does not read, or a key its section does not have, is exit 2 with one line naming
the field and the fix, before any work (DLIO's `checkpoint.fsync` trap: a key that silently
never reaches the code)."""

from __future__ import annotations

import json

import pytest

from iobench.cli import main


@pytest.mark.parametrize("argv, field, hint", [
    (["load", "{tmp}/ds", "--set", "laod.workers=4"], "--set", "did you mean 'load'"),
    (["load", "{tmp}/ds", "--set", "load=4"], "--set", "load.KEY=VALUE"),
    (["gen", "--out", "{tmp}/g", "--set", "load.seed=1"], "--set", "gen.KEY=VALUE"),
    (["gen", "--out", "{tmp}/g", "--set", "gen.num_sampels=3"], "gen.num_sampels", "num_samples"),
    (["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--local", "{tmp}/l", "--set", "ckpt.cuont=2"],
     "ckpt.cuont", "did you mean 'count'"),
    (["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--local", "{tmp}/l", "--set", "load.workers=2"],
     "--set", "ckpt.KEY=VALUE"),
    (["probe", "file", "{tmp}", "--set", "metadata.files=3"], "--set", "file.KEY=VALUE"),
])
def test_unread_set_keys_are_refused(tmp_path, capsys, argv, field, hint):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0] and hint in err[0], err
    assert not (tmp_path / "g").exists() and not (tmp_path / "l").exists()   # refused before any work


def test_ckpt_reads_set_ckpt_keys(tmp_path):
    out = tmp_path / "c.json"
    assert main(["ckpt", "--preset", "llama3-8b", "--scale", "1e-5", "--local", str(tmp_path / "l"), "--no-fsync",
                 "--set", "ckpt.count=2", "--set", "ckpt.durable_bw=bw:500MB/s", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["config"]["count"] == 2 and res["config"]["durable_bw"] == 500e6
    assert res["metrics"]["checkpoint"]["saves"]["committed"] == 2


@pytest.mark.parametrize("command", ["gen", "load"])
def test_precedence_is_workload_then_flags_then_set(tmp_path, command):
    """The README's rule, the same for every command: a workload is overridden by flags, and
    ``--set`` overrides both (``load`` once let flags win over ``--set``)."""
    from iobench.cli import build_parser
    from iobench.commands import gen, load

    if command == "gen":
        argv = ["gen", "--out", str(tmp_path / "g"), "--workload", "llm-tokens", "--seed", "5"]
        read = lambda a: gen.spec_from_args(a).seed  # noqa: E731
    else:
        argv = ["load", str(tmp_path / "ds"), "--workload", "llm-tokens", "--seed", "5"]
        read = lambda a: load.build_config(a).seed  # noqa: E731
    parser = build_parser()
    assert read(parser.parse_args(argv)) == 5
    assert read(parser.parse_args(argv + ["--set", f"{command}.seed=7"])) == 7
