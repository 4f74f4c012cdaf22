"""Reports: one self-contained HTML page (plots as PNG data URIs) and a Markdown summary."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import base64
import json
import re
import shutil
import subprocess

import pytest

from iobench.cli import main
from iobench.metrics import LatencyHistogram
from iobench.planner.models import plan
from iobench.report.build import build_report
from iobench.results import Results
from results_helpers import load_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _hdr(values):
    h = LatencyHistogram()
    for v in values:
        h.record_s(v)
    return h.summary()


def _hist(values):
    h = LatencyHistogram()
    for v in values:
        h.record_s(v)
    return h.encode()


def load_results(path, stall=0.05, au=0.95):
    steps = 40
    return Results(command="load", config={"storage_options": {"secret": "hunter2"}}, metrics=load_metrics(
        batch_wait_s=_hdr([0.001 * (1 + i % 7) for i in range(200)]),
        batch_io_s=_hdr([0.01 * (1 + i % 5) for i in range(200)]),
        stall_ratio=stall, accelerator_utilization=au,
        throughput={"bytes_per_s": 4.2e8, "samples_per_s": 1800.0},
        batch_io_hist=_hist([0.01 * (1 + i % 5) for i in range(200)]),
        batch_service_s=_hdr([0.012 * (1 + i % 5) for i in range(200)]),
        batch_service_hist=_hist([0.012 * (1 + i % 5) for i in range(200)]),
        compute_s=_hdr([0.1] * steps), steps=steps, batch_bytes=2.0**20, bytes_read=int(1.3 * steps * 2**20),
        steady_window={"from_step": 3, "to_step": steps - 2, "rule": "test"},
        series={"t_s": [0.1 * i for i in range(steps)], "wait_s": [0.3 if i < 3 else 0.001 * (i % 5) for i in range(steps)],
                "step_s": [0.4 if i < 3 else 0.1 + 0.001 * (i % 5) for i in range(steps)]},
    )).write(path)


def other_results(tmp_path):
    ckpt = Results(command="ckpt", metrics={"checkpoint": {
        "blocking_s": _hdr([0.2, 0.25, 0.22]), "commit_latency_s": _hdr([1.1, 1.3, 1.2]),
        "timeline": [{"checkpoint": f"step {s}", "phase": ph, "start_s": s + a, "end_s": s + b}
                     for s in (0, 10, 20) for ph, a, b in (("snapshot", 0, 0.2), ("commit", 0.2, 1.4))]}})
    gds = Results(command="gds", environment={"gds": {"paths": {
        "cufile": {"available": False, "reason": "no NVIDIA driver"}, "cpu": {"available": True, "reason": None}},
        "best_path": "cpu"}, "effective_gds_path": {"cufile": {"effective": "cpu", "fallback_reason": "no GPU"}}},
        metrics={"paths": [
        {"path": "cpu", "requested": "cpu", "effective": "cpu", "bytes_per_s": 2.1e9, "evidence": "pread"},
        {"path": "cufile", "requested": "cufile", "effective": "unavailable", "bytes_per_s": None,
         "evidence": "no NVIDIA GPU"}]})
    spec = {"title": "Bandwidth vs request size", "x_label": "request size (bytes)", "y_label": "bytes_per_s",
            "x_log": True, "y_log": False, "series": [{"label": "read seq", "points": [[4096, 1e8], [1048576, 1.5e9]]}]}
    probe = Results(command="probe", metrics={"plots": {"bw": spec},
                                              "tiers": {"nvme": {"read_bytes_per_s": 1.9e9, "read_latency_s":
                                                                _hdr([1e-4, 2e-4, 3e-4])},
                                                       "object": {"read_bytes_per_s": 2.2e8, "read_latency_s":
                                                                  _hdr([5e-3, 8e-3, 2e-2])}}})
    pl = Results(command="plan", metrics={"plan": plan("interval", {"cost": "16s", "job_mtbf": "8h"})})
    return [ckpt.write(tmp_path / "ckpt.json"), gds.write(tmp_path / "gds.json"),
            probe.write(tmp_path / "probe.json"), pl.write(tmp_path / "plan.json")]


def images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


def test_report_is_self_contained_with_plots_for_every_shape(tmp_path):
    files = [load_results(tmp_path / "load.json"), *other_results(tmp_path)]
    rep = build_report(files, tmp_path / "out", limits={"min_au": 0.9})
    page = rep.html.read_text()
    assert rep.ok and rep.html.stat().st_mode & 0o044
    pngs = images(page)
    assert len(pngs) >= 7 and all(p.startswith(PNG_MAGIC) for p in pngs)
    # Nothing is fetched from elsewhere: every src is a data URI, no scripts, no stylesheets by link.
    assert not re.search(r'(src|href)="(?!data:|#)', page) and "<script" not in page
    # captions name metrics in words, not paths
    for caption in ("data stall over time (headline 5.00%", "batch service time: a batch slower",
                    "read amplification: bytes read per byte delivered", "throughput by tier / path",
                    "checkpoint timeline: timeline", "plan interval: overhead by interval",
                    "plots bw: Bandwidth vs request size"):
        assert caption in page, caption
    assert "cufile" in page and "no NVIDIA GPU" in page                  # the GDS path table
    assert "GPU read paths on this node" in page and "Requested vs effective read path" in page
    assert "hunter2" not in page                                         # secrets stay redacted
    md = rep.markdown.read_text()
    assert "accelerator utilization" in md and "plan interval" in md and "| batch_wait_s |" in md


def test_report_cli_thresholds_set_the_exit_code(tmp_path, capsys):
    good, bad = load_results(tmp_path / "good.json"), load_results(tmp_path / "bad.json", stall=0.3, au=0.7)
    assert main(["report", str(good), "-o", str(tmp_path / "r1"), "--min-au", "0.9"]) == 0
    capsys.readouterr()
    assert main(["report", str(bad), "-o", str(tmp_path / "r2"), "--min-au", "0.9"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 of 1 checks failed.") and any("FAIL" in line for line in out[1:])
    assert main(["report", str(good), "-o", str(tmp_path / "r3"), "--max-stall", "0.01"]) == 1
    assert main(["report", str(good), "-o", str(tmp_path / "r4"), "--min-au", "90"]) == 2
    assert main(["report", str(tmp_path / "missing.json"), "-o", str(tmp_path / "r5")]) == 2
    (tmp_path / "junk.json").write_text("{not json")
    assert main(["report", str(tmp_path / "junk.json"), "-o", str(tmp_path / "r6")]) == 2


def test_report_of_a_run_json_renders_its_stage_metrics(tmp_path):
    run = Results(command="run", metrics={"load": {"cold": {STALL_RATIO: 0.2, "batch_wait_s": _hdr([0.01, 0.02])},
                                                   "warm": {STALL_RATIO: 0.01, "batch_wait_s": _hdr([0.001])},
                                                   "prefetch_recommendation": "prefetch depth 3"}})
    rep = build_report([run.write(tmp_path / "run.json")], tmp_path / "out")
    page = rep.html.read_text()
    assert "load.cold.stall_ratio" in page and "prefetch depth 3" in page


CHECK_JS = """<script>
var loadErrors = 0;
window.addEventListener("error", function () { loadErrors++; }, true);
window.addEventListener("load", function () {
  var imgs = Array.from(document.images);
  var broken = imgs.filter(function (i) { return !i.complete || i.naturalWidth === 0; }).length;
  var pre = document.createElement("pre"); pre.id = "iobench-check";
  pre.textContent = JSON.stringify({images: imgs.length, broken: broken, errors: loadErrors});
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (scripts/install-system-deps.sh)")
def test_report_renders_in_headless_chromium(tmp_path):
    files = [load_results(tmp_path / "load.json"), *other_results(tmp_path)]
    rep = build_report(files, tmp_path / "out")
    page = rep.html.read_text()
    # The checker is injected into a copy: the report itself carries no scripts.
    probe = tmp_path / "out" / "check.html"
    probe.write_text(page.replace("</body>", CHECK_JS + "</body>"))
    proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                           "--enable-logging=stderr", "--v=0", f"--user-data-dir={tmp_path / 'profile'}",
                           "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    m = re.search(r'id="iobench-check">([^<]*)<', proc.stdout)
    assert m, proc.stderr[-2000:]
    result = json.loads(m.group(1))
    assert result["images"] == len(images(page)) >= 7
    assert result["broken"] == 0 and result["errors"] == 0
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console


def test_report_of_run_json_includes_the_stage_files_it_lists(tmp_path):
    stage = load_results(tmp_path / "load" / "local-raw-tokens-cold.json")
    run = Results(command="run", environment={"results_files": [str(stage), str(tmp_path / "gone.json")]},
                  metrics={"load": {"datasets": 1, "stage_s": 3.0}})
    rep = build_report([run.write(tmp_path / "run.json")], tmp_path / "out")
    page = rep.html.read_text()
    assert "load/local-raw-tokens-cold.json" in page and "data stall over time" in page


def test_verdict_gives_the_most_stalled_loads_own_advice():
    from iobench.report.html import verdict

    def load(stall, rec=None):
        m = {STALL_RATIO: stall, "accelerator_utilization": 1 - stall, "throughput": {"bytes_per_s": 1e8}}
        if rec:
            m["prefetch_recommendation"] = rec
        return {"command": "load", "metrics": m}

    docs = [(f"l{i}.json", load(0.01)) for i in range(4)]
    text, bad = verdict(docs + [("s3.json", load(0.84, {"workers_recommended": 18, "prefetch_factor_recommended": 3,
                                                         "depth_total": 54, "depth_recommended": 39,
                                                         "note": "18 workers exceed this host's 2 cores"}))], None)
    assert bad and "to 84.00% (s3.json)." in text
    # the terminal's wording (iobench load prints "advice: num_workers 18, prefetch_factor 3 (54 batches ...")
    assert ("To feed s3.json: num_workers 18, prefetch_factor 3 (54 batches in flight); 18 workers exceed this "
            "host's 2 cores.") in text
    # nothing stalls: no advice to give
    assert "To feed it" not in verdict(docs, None)[0]


def test_report_without_matplotlib_gives_the_tables_and_the_text(tmp_path):
    # the README's [s3] install has no matplotlib: `iobench report` must still answer (it exited 2)
    import subprocess
    import sys

    f = load_results(tmp_path / "load.json", stall=0.3, au=0.7)
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from iobench.cli import main\n"
            f"sys.exit(main(['report', {str(f)!r}, '-o', {str(tmp_path / 'out')!r}, '--text', '--max-stall', '0.1']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr                       # the check fails; the report is written
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("1 of 1 checks failed.") and "no plots: pip install 'iobench[report]'" in lines[1]
    assert "# iobench report" in proc.stdout and "| batch_wait_s |" in proc.stdout     # the Markdown, printed
    page = (tmp_path / "out" / "report.html").read_text()
    assert "No plots: matplotlib is not installed" in page and "<img" not in page
    assert (tmp_path / "out" / "report.md").exists()


def test_the_report_gives_the_prefetch_advice_the_terminal_printed(tmp_path, capsys):
    # the report said "prefetch depth 5" where `iobench load` had printed "prefetch_factor 3"
    from loader_helpers import tokens_dataset

    class Factory:
        def mktemp(self, name):
            (tmp_path / name).mkdir()
            return tmp_path / name

    url = tokens_dataset(Factory(), "tok", samples=2000, shard_samples=250)
    out = tmp_path / "load.json"
    assert main(["load", url, "-W", "1", "-Q", "1", "-B", "20", "--steps", "60", "--compute-ms", "2",
                 "--emulate", "const:8ms", "--recommend", "--json", str(out)]) == 0
    advice = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("advice: "))
    words = advice.removeprefix("advice: ").split(", host memory")[0]     # "num_workers W, prefetch_factor Q (...)"
    assert words.startswith("num_workers ") and "prefetch_factor " in words
    assert main(["report", str(out), "-o", str(tmp_path / "rep"), "--max-stall", "0.01"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"To feed it: {words}" in lines[0], (lines[0], words)
    md = (tmp_path / "rep" / "report.md").read_text()
    assert words in md
