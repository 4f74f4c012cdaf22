"""The report reads in a minute: in headless Chromium at 1280x800, the part shown before any
section is expanded is at most six screens tall, no element is wider than the viewport (with
every section expanded too), and the page logs no console errors.

Set IOBENCH_REPORT_SCREENSHOTS=DIR to also write report-top.png / report-expanded.png there
(the committed ones are under reports/reference/)."""

from __future__ import annotations

from iobench.schema import STALL_RATIO
import json
import os
import re
import shutil
import subprocess

import pytest

from iobench.metrics import LatencyHistogram
from iobench.report.build import build_report
from iobench.results import Results
from results_helpers import load_metrics

W, H = 1400, 800


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _hdr(values):
    h = LatencyHistogram()
    for v in values:
        h.record_s(v)
    return h.summary(), h.encode()


def _many_loads(tmp_path, n=33):
    """What a tiered `iobench run` leaves: dozens of loads whose stall spans 0.3% to 66%."""
    files = []
    for i in range(n):
        stall = 0.003 + (0.66 - 0.003) * (i / (n - 1)) ** 3
        wait, enc = _hdr([0.001 * (1 + (i + k) % 9) * (1 + 40 * stall) for k in range(300)])
        io, _ = _hdr([0.004 * (1 + k % 5) * (1 + 10 * stall) for k in range(300)])
        m = {STALL_RATIO: stall, "stall_ratio_ci95": [max(0, stall - 0.002), stall + 0.002],
             "accelerator_utilization": 1 - stall,
             "throughput": {"bytes_per_s": 2.1e9 / (1 + 300 * stall), "samples_per_s": 9000.0 / (1 + 300 * stall)},
             "batch_wait_s": wait, "batch_io_s": io, "batch_io_hist": enc,
             "per_worker": [{"worker": w, "bytes": 10**8 + w, "hist": enc} for w in range(8)],
             "timeseries": {"t": [0.1 * k for k in range(50)], "wait_s": [0.001 * (k % 7) for k in range(50)]}}
        if i % 5 == 0:
            m["prefetch_recommendation"] = {"depth_min": 2, "depth_recommended": 3 + i % 3,
                                            "host_bytes_total": 3 * 2**28, "p99_batch_io_s": 0.3, "compute_s": 0.18,
                                            "validation": {"depth": 3, "stall_ratio_at_depth": stall,
                                                           "stall_ratio_at_depth_1": min(0.95, stall * 3)}}
        files.append(Results(command="load", config={"dataset": f"/nvme/tier{i % 3}/dataset-{i:02d}-" + "x" * 60},
                             metrics=load_metrics(**m)).write(tmp_path / f"load-tier{i % 3}-{i:02d}.json"))
    probe = Results(command="probe", metrics={"summary": {"seq_read": {"bytes_per_s": 2.68e9},
                                                          "rand_read_4k": {"iops": 250000.0}}})
    files.append(probe.write(tmp_path / "probe.json"))
    return files


CHECK_JS = """<script>
var errs = 0;
window.addEventListener("error", function () { errs++; }, true);
window.addEventListener("load", function () {
  function widest() {
    var vw = document.documentElement.clientWidth, worst = 0, what = "";
    document.querySelectorAll("body *").forEach(function (e) {
      var r = e.getBoundingClientRect();
      if (r.width > 0 && r.right > worst) { worst = r.right; what = e.tagName + "." + e.className; }
    });
    return {right: worst, what: what, viewport: vw, scroll: document.documentElement.scrollWidth};
  }
  var out = {collapsedHeight: document.documentElement.scrollHeight, collapsed: widest()};
  document.querySelectorAll("details").forEach(function (d) { d.open = true; });
  out.expanded = widest();
  out.expandedHeight = document.documentElement.scrollHeight;
  out.errors = errs;
  var pre = document.createElement("pre"); pre.id = "iobench-layout";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars"]


@pytest.mark.skipif(chromium() is None, reason="chromium is not installed (scripts/install-system-deps.sh)")
def test_report_fits_the_screen_in_chromium(tmp_path):
    rep = build_report(_many_loads(tmp_path), tmp_path / "out", limits={"max_stall": 0.05})
    page = rep.html.read_text()
    assert page.index('class="verdict') < page.index("<h2>Loads</h2>") < page.index("<h2>Detail</h2>")
    probe = tmp_path / "out" / "layout.html"
    probe.write_text(page.replace("</body>", CHECK_JS + "</body>"))
    proc = subprocess.run([chromium(), *FLAGS, "--enable-logging=stderr", "--v=0",
                           f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={W},{H}",
                           "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=180)
    m = re.search(r'id="iobench-layout">([^<]*)<', proc.stdout)
    assert m, proc.stderr[-2000:]
    got = json.loads(m.group(1))
    assert got["errors"] == 0
    assert got["collapsedHeight"] <= 2 * H, got          # the page above the detail: two screens at most
    for state in ("collapsed", "expanded"):
        assert got[state]["scroll"] <= got[state]["viewport"], (state, got)
        assert got[state]["right"] <= got[state]["viewport"] + 1, (state, got)
    console = [ln for ln in proc.stderr.splitlines() if ":CONSOLE" in ln]
    assert not console, console
    shots = os.environ.get("IOBENCH_REPORT_SCREENSHOTS")
    if shots:
        os.makedirs(shots, exist_ok=True)
        for name, height, src in (("report-top.png", H, rep.html), ("report-first-screens.png", 3 * H, rep.html)):
            subprocess.run([chromium(), *FLAGS, f"--user-data-dir={tmp_path / 'profile2'}", f"--window-size={W},{height}",
                            f"--screenshot={os.path.join(shots, name)}", src.as_uri()],
                           capture_output=True, timeout=180, check=True)
