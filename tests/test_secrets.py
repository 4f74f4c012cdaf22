"""Credentials inside URLs never reach an error line, a log line or a results file."""

from __future__ import annotations

import json
import logging

import pytest

from iobench.cli import main
from iobench.results import Results, redact, redact_text

SECRET_URL = "http://AKIAEXAMPLEKEY:wJalrXUtnFEMI-SUPERSECRET@127.0.0.1:1"


@pytest.mark.parametrize("text, want", [
    ("http://KEY:SECRET@host:9000/x", "http://***@host:9000/x"),
    ("cannot reach 'https://tok@h' (x)", "cannot reach 'https://***@h' (x)"),
    ("s3://b/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=ab12", "s3://b/k?X-Amz-Credential=***&X-Amz-Signature=***"),
    ("user@example.org wrote 3 shards", "user@example.org wrote 3 shards"),
    ("/data/ds@v2/shard.bin", "/data/ds@v2/shard.bin"),
])
def test_redact_text(text, want):
    assert redact_text(text) == want


def test_results_mask_urls_everywhere_but_keep_data_keys(tmp_path):
    r = Results(command="x", config={"endpoint_url": SECRET_URL, "token_dtype": "uint16",
                                     "storage_options": {"secret": "s", "key": "k"}})
    r.metrics = {"source": {"url": SECRET_URL}, "tokens_per_s": 5.0}
    r.warn(f"slow endpoint {SECRET_URL}")
    text = r.write(tmp_path / "r.json").read_text()
    assert "SUPERSECRET" not in text and "AKIAEXAMPLEKEY" not in text
    d = json.loads(text)
    assert d["config"]["token_dtype"] == "uint16" and d["metrics"]["tokens_per_s"] == 5.0
    assert d["config"]["storage_options"] == {"secret": "***", "key": "***"}
    assert redact({"a": [SECRET_URL]}) == {"a": ["http://***@127.0.0.1:1"]}


@pytest.mark.parametrize("argv", [
    ["verify", "s3://iobench/nothing"],
    ["load", "s3://iobench/nothing", "--steps", "1"],
    ["gen", "--workload", "llm-tokens-small", "--out", "s3://iobench/nothing"],
])
def test_endpoint_secret_never_in_error_line(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    monkeypatch.chdir(tmp_path)
    rc = main([*argv, "--endpoint-url", SECRET_URL])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "SUPERSECRET" not in err and "AKIAEXAMPLEKEY" not in err and "***@127.0.0.1:1" in err
    assert len(err.strip().splitlines()) == 1


def test_log_records_are_masked(caplog):
    from iobench.cli import _mask_secrets_in_logs

    _mask_secrets_in_logs()
    with caplog.at_level(logging.WARNING):
        logging.getLogger("iobench.test").warning("fetching %s", SECRET_URL)
    assert "SUPERSECRET" not in caplog.text and "***@127.0.0.1:1" in caplog.text


# ---- every channel, generated: a URL's user:password and the environment's secret never reach stderr,
# stdout, a --debug traceback, the JUnit XML (properties and failure messages) or the results file.

def _closed_port() -> int:
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


ENV_SECRET = "envSECRETvalue-0123456789"
CHANNEL_ARGV = {
    "smoke": lambda url, d: ["smoke", "--endpoint-url", url, "--bucket", "iobench", "--timeout", "5s",
                             "--junit", str(d / "smoke.xml"), "--json", str(d / "r.json")],
    "verify": lambda url, d: ["verify", "s3://iobench/nothing", "--endpoint-url", url],
    "load": lambda url, d: ["load", "s3://iobench/nothing", "--steps", "1", "--endpoint-url", url],
    "gen": lambda url, d: ["gen", "--num-samples", "8", "--out", "s3://iobench/nothing", "--endpoint-url", url],
    "index": lambda url, d: ["index", "s3://iobench/nothing", "--format", "tar", "--endpoint-url", url],
    "bad flag": lambda url, d: ["load", "s3://iobench/nothing", "--endpoint-url", url, "--no-such-flag", url],
}


@pytest.mark.parametrize("debug", [False, True], ids=["plain", "debug"])
@pytest.mark.parametrize("name", list(CHANNEL_ARGV))
def test_no_secret_on_any_channel(name, debug, tmp_path, monkeypatch):
    """Run as a user would (a subprocess: the interpreter prints --debug's traceback itself) and look
    at every byte it wrote: stdout, stderr and every file it made."""
    import os
    import subprocess
    import sys

    url = f"http://AKIAEXAMPLEKEY:wJalrXUtnFEMI-SUPERSECRET@127.0.0.1:{_closed_port()}"
    env = dict(os.environ, AWS_ACCESS_KEY_ID="AKIAEXAMPLEKEY", AWS_SECRET_ACCESS_KEY=ENV_SECRET)
    argv = [sys.executable, "-m", "iobench.cli", *(["--debug"] if debug else []), *CHANNEL_ARGV[name](url, tmp_path)]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert res.returncode != 0
    outputs = {"stdout": res.stdout, "stderr": res.stderr}
    outputs |= {str(p): p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file()}
    for where, text in outputs.items():
        for secret in ("SUPERSECRET", "wJalrXUtnFEMI", ENV_SECRET):
            assert secret not in text, f"{secret} in {where}: {text[-2000:]}"
    # credentials in an endpoint URL are refused up front (exit 2, one line), never sent anywhere
    # (--debug re-raises: the interpreter prints the traceback, through the masked stderr, and exits 1)
    assert name == "bad flag" or "carries credentials" in res.stderr and res.returncode == (1 if debug else 2), \
        res.stderr
    if not debug:
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    else:
        assert "Traceback" in res.stderr or name == "bad flag"


def test_junit_xml_is_masked_in_properties_and_messages(monkeypatch):
    """The JUnit writer goes through the one redaction function: a secret in an endpoint, a failure
    message or a property never reaches the XML."""
    from iobench.results import register_secret
    from iobench.smoke import Check, SmokeReport, junit_xml

    register_secret(ENV_SECRET)
    c = Check("connect")
    c.status, c.message = "failed", f"denied for {SECRET_URL} with secret {ENV_SECRET}"
    rep = SmokeReport(endpoint_url=SECRET_URL, bucket="iobench", prefix="ci", checks=[c])
    xml = junit_xml(rep).decode()
    assert "SUPERSECRET" not in xml and "AKIAEXAMPLEKEY" not in xml and ENV_SECRET not in xml
    assert "***@127.0.0.1:1" in xml and xml.startswith("<?xml")


def test_a_results_file_holding_a_secret_is_masked_in_reports_and_comparisons(tmp_path):
    """Reports and comparisons read results through one reader, which masks what it reads: a file
    edited by hand (or written elsewhere) with a URL's credentials never repeats them."""
    from iobench.cli import main

    ds = tmp_path / "ds"
    assert main(["gen", "--num-samples", "8", "--seq-len", "8", "--out", str(ds), "--no-progress"]) == 0
    a = tmp_path / "a.json"
    assert main(["verify", str(ds), "--json", str(a)]) == 0
    d = json.loads(a.read_text())
    d["config"]["note"] = f"copied from {SECRET_URL}"
    d.setdefault("warnings", []).append(f"slow {SECRET_URL}")
    a.write_text(json.dumps(d))
    assert main(["report", str(a), "-o", str(tmp_path / "rep")]) in (0, 1)
    assert main(["compare", str(a), str(a), "--markdown", str(tmp_path / "c.md"),
                 "--json", str(tmp_path / "c.json")]) in (0, 1)
    for p in [*(tmp_path / "rep").iterdir(), tmp_path / "c.md", tmp_path / "c.json"]:
        text = p.read_text(errors="replace")
        assert "SUPERSECRET" not in text and "AKIAEXAMPLEKEY" not in text, p
