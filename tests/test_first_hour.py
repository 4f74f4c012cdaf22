"""A newcomer's first hour: install hints for missing extras, file modes, --version,
`--json -`, progress defaults, times in results, pipes that close early."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from iobench.cli import main

IOBENCH = [sys.executable, "-m", "iobench.cli"]


def _run(args, **kw):
    return subprocess.run(IOBENCH + args, capture_output=True, text=True, timeout=120, **kw)


def test_version_flag():
    p = _run(["--version"])
    assert p.returncode == 0 and p.stdout.startswith("iobench ")


@pytest.mark.parametrize("module,extra", [("pyarrow", "parquet"), ("matplotlib", "report"), ("PIL", "images")])
def test_missing_extra_gives_one_line_install_hint(module, extra, tmp_path):
    """Each heavy package sits behind an extra; without it the command exits 2 with the pip line
    (the report: written without plots, with the pip line)."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    # a meta-path finder that refuses the module, as if it were not installed
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name == {module!r} or name.startswith({module!r} + '.'):\n"
        "            raise ImportError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _Block())\n")
    env = dict(os.environ, PYTHONPATH=str(blocker))
    out = tmp_path / "ds"
    if extra == "parquet":
        args = ["gen", "--out", str(out), "--format", "parquet", "--num-samples", "8"]
    elif extra == "images":
        args = ["gen", "--out", str(out), "--modality", "images", "--num-samples", "4"]
    else:
        main(["gen", "--out", str(out), "--num-samples", "64"])
        main(["load", str(out), "--steps", "4", "--json", str(tmp_path / "g.json")])
        args = ["report", str(tmp_path / "g.json"), "-o", str(tmp_path / "rep")]
    p = _run(args, env=env)
    if extra == "report":
        # the report is written without plots (its tables hold every number) and says how to get them
        assert p.returncode == 0, p.stderr
        assert "no plots: pip install 'iobench[report]'" in p.stdout and "Traceback" not in p.stderr
        return
    assert p.returncode == 2, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert f"pip install 'iobench[{extra}]'" in lines[0]
    assert "Traceback" not in p.stderr


def test_files_follow_the_process_umask(tmp_path):
    old = os.umask(0o022)
    try:
        assert main(["gen", "--out", str(tmp_path / "ds"), "--num-samples", "8",
                     "--json", str(tmp_path / "r.json")]) == 0
    finally:
        os.umask(old)
    for p in [tmp_path / "r.json", *sorted((tmp_path / "ds").iterdir())]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p


def test_json_dash_is_stdout_and_times_are_real(tmp_path):
    ds = tmp_path / "ds"
    assert main(["gen", "--out", str(ds), "--num-samples", "64"]) == 0
    p = _run(["load", str(ds), "--steps", "4", "--json", "-"])
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)  # only the document on stdout
    assert doc["command"] == "load"
    assert "stall" in p.stderr  # the human line went to stderr
    assert not (tmp_path / "-").exists() and not os.path.exists("-")
    assert doc["finished_at"] > doc["started_at"]


def test_progress_flags_and_default(tmp_path):
    from iobench.cli import build_parser, want_progress

    parser = build_parser()
    for cmd in (["load", "x"], ["ckpt"], ["run"]):
        assert want_progress(parser.parse_args(cmd + ["--no-progress"])) is False
        assert want_progress(parser.parse_args(cmd + ["--progress"])) is True
        # default: a terminal decides (pytest's stderr is not one)
        assert want_progress(parser.parse_args(cmd)) is sys.stderr.isatty()


def test_json_file_written_even_when_the_reader_stops_early(tmp_path):
    ds = tmp_path / "ds"
    assert main(["gen", "--out", str(ds), "--num-samples", "64", "--json", str(tmp_path / "a.json")]) == 0
    out = tmp_path / "c.json"
    cmd = " ".join(IOBENCH) + f" compare --all {tmp_path / 'a.json'} {tmp_path / 'a.json'} --json {out} | head -1"
    p = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert out.exists(), p.stderr
    assert "Traceback" not in p.stderr


def test_tables_are_full_width_in_pipes(tmp_path):
    ds = tmp_path / "ds"
    assert main(["gen", "--out", str(ds), "--num-samples", "64"]) == 0
    assert main(["load", str(ds), "--steps", "4", "--json", str(tmp_path / "a.json")]) == 0
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    p = _run(["compare", "--all", str(tmp_path / "a.json"), str(tmp_path / "a.json")], env=env)
    widths = [len(ln) for ln in p.stdout.splitlines()]
    assert max(widths) > 80, p.stdout  # not wrapped at rich's 80-column default


def test_run_config_missing_work_dir_is_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"work_dir: {tmp_path / 'nope'}\n")
    p = _run(["run", "--config", str(cfg), "--out", str(tmp_path / "o")])
    assert p.returncode == 2
    assert "work_dir" in p.stderr and "Traceback" not in p.stderr
