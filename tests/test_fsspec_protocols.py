"""Any fsspec protocol: http(s) with byte ranges (a local server on 127.0.0.1) and memory://,
with --storage-option; unknown schemes and missing packages refused in one line."""

from __future__ import annotations

import json
import os
import re
import threading
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from iobench.cli import main


class RangeHandler(SimpleHTTPRequestHandler):
    """http.server with single-range GETs (206) and HEAD sizes, as object gateways serve them."""

    ranges_served = 0

    def log_message(self, *a):  # quiet
        pass

    def send_head(self):
        rng = self.headers.get("Range")
        path = self.translate_path(self.path)
        if not rng or os.path.isdir(path):
            return super().send_head()
        m = re.match(r"bytes=(\d+)-(\d*)$", rng)
        if not m or not os.path.exists(path):
            self.send_error(416 if m else 400)
            return None
        size = os.path.getsize(path)
        start = int(m.group(1))
        end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
        f = open(path, "rb")
        f.seek(start)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        type(self).ranges_served += 1
        self._remaining = end - start + 1
        return f

    def copyfile(self, source, outputfile):
        n = getattr(self, "_remaining", None)
        if n is None:
            return super().copyfile(source, outputfile)
        outputfile.write(source.read(n))
        self._remaining = None


@pytest.fixture
def http_root(tmp_path):
    pytest.importorskip("aiohttp")
    root = tmp_path / "www"
    root.mkdir()
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(RangeHandler, directory=str(root)))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_load_and_verify_over_http_with_ranges(tmp_path, http_root):
    root, base = http_root
    assert main(["gen", "--out", str(root / "ds"), "--format", "tar", "--num-samples", "48",
                 "--shard-size", "16 samples"]) == 0
    url = f"{base}/ds"
    assert main(["verify", url]) == 0
    RangeHandler.ranges_served = 0
    assert main(["load", url, "--batch-size", "4", "--workers", "1", "--no-shuffle", "--no-progress",
                 "--storage-option", "block_size=4096", "--json", str(tmp_path / "l.json")]) == 0
    doc = json.loads((tmp_path / "l.json").read_text())
    assert doc["metrics"]["samples"] == 48
    assert '"block_size": 4096' not in json.dumps(doc)  # storage options stay out of results
    # ranged reads (what per-sample access uses) go to the server as Range requests
    from iobench.storage import open_backend

    b = open_backend(url)
    shard = json.loads(b.cat("manifest.json"))["shards"][1]
    want = (root / "ds" / shard["path"]).read_bytes()[1000:3000]
    RangeHandler.ranges_served = 0
    assert b.cat(shard["path"], 1000, 3000) == want
    assert RangeHandler.ranges_served >= 1
    # a foreign dataset on a read-only server: index it with the manifest written locally
    assert main(["index", url, "--format", "tar", "--out", str(tmp_path / "m.json")]) == 0
    m = json.loads((tmp_path / "m.json").read_text())
    assert m["total_samples"] == 48 and len(m["shards"]) == 3


def test_memory_protocol_roundtrip(tmp_path):
    url = "memory://h17-proto/ds"
    assert main(["gen", "--out", url, "--num-samples", "32"]) == 0
    assert main(["verify", url]) == 0
    assert main(["load", url, "--start-method", "fork", "--no-progress", "--batch-size", "8"]) == 0


def test_unknown_scheme_and_bad_storage_option(capsys):
    assert main(["verify", "nosuchproto://x/y"]) == 2
    err = capsys.readouterr().err
    assert "nosuchproto" in err and len(err.strip().splitlines()) == 1
    assert main(["verify", "memory://x", "--storage-option", "novalue"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_credentials_in_storage_options_are_never_echoed(tmp_path, http_root, capsys):
    root, base = http_root
    assert main(["gen", "--out", str(root / "ds"), "--num-samples", "16"]) == 0
    secret = "s3cr3t-value-h17"
    rc = main(["verify", f"{base}/ds", "--storage-option", f"headers.Authorization=Bearer {secret}",
               "--json", str(tmp_path / "v.json")])
    assert rc == 0
    cap = capsys.readouterr()
    assert secret not in cap.out + cap.err
    assert secret not in (tmp_path / "v.json").read_text()
