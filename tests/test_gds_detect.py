"""Path detection: the decision table from fake /proc and /sys trees, the probe child's timeout."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from iobench.gds import detect

KERNEL = "6.8.0-test"
FILE = "/data/shard.bin"
NVME = (259, 0)
NVME_PART = (259, 1)
VIRTIO = (254, 0)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)


def fake_root(tmp: Path, *, nvidia=True, nvfs=True, udev=True, p2p=False, fs="ext4") -> Path:
    r = tmp / "root"
    (r / "proc/sys/kernel").mkdir(parents=True)
    (r / "proc/sys/kernel/osrelease").write_text(KERNEL + "\n")
    (r / "proc/self").mkdir(parents=True)
    (r / "proc/self/mountinfo").write_text(
        "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        f"90 27 259:1 / /data rw,relatime - {fs} /dev/nvme0n1p1 rw\n")
    if nvidia:
        (r / "proc/driver/nvidia").mkdir(parents=True)
        (r / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86\n")
        (r / "dev").mkdir(exist_ok=True)
        (r / "dev/nvidia0").write_text("")
        (r / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
        (r / "usr/lib/x86_64-linux-gnu/libcuda.so.1").write_text("")
        (r / "usr/lib/x86_64-linux-gnu/libcufile.so.1.14.0").write_text("")
    if nvfs:
        (r / "proc/driver/nvidia-fs").mkdir(parents=True)
        (r / "proc/driver/nvidia-fs/version").write_text("version: 2.24\n")
    if udev:
        (r / "run/udev/data").mkdir(parents=True)
    (r / "boot").mkdir()
    (r / "boot" / f"config-{KERNEL}").write_text("CONFIG_PCI_P2PDMA=y\n" if p2p else "# CONFIG_PCI_P2PDMA is not set\n")
    # NVMe disk with a partition, behind a PCI function bound to the nvme driver.
    pci = r / "sys/devices/pci0000:00/0000:01:00.0"
    disk = pci / "nvme/nvme0/nvme0n1"
    (disk / "nvme0n1p1").mkdir(parents=True)
    (disk / "nvme0n1p1/partition").write_text("1\n")
    (r / "sys/bus/pci/drivers/nvme").mkdir(parents=True)
    _link(pci / "driver", r / "sys/bus/pci/drivers/nvme")
    _link(disk / "device", pci / "nvme/nvme0")
    _link(r / "sys/dev/block/259:0", disk)
    _link(r / "sys/dev/block/259:1", disk / "nvme0n1p1")
    if p2p:
        (pci / "p2pmem").mkdir()
        _link(r / "sys/bus/pci/devices/0000:01:00.0", pci)
    # A virtio disk.
    virtio = r / "sys/devices/pci0000:00/0000:00:02.0/virtio1"
    (virtio / "block/vda").mkdir(parents=True)
    (r / "sys/bus/virtio/drivers/virtio_blk").mkdir(parents=True)
    _link(virtio / "driver", r / "sys/bus/virtio/drivers/virtio_blk")
    _link(virtio / "block/vda/device", virtio)
    _link(r / "sys/dev/block/254:0", virtio / "block/vda")
    return r


def runtime(*, gpu=True, kvikio=True, kvikio_imports=True, torch=False, cupy=False, driver_open=True,
            gds_available=True, devices=1) -> dict:
    rt: dict = {"timed_out": False, "timeout_s": 20.0, "complete": True, "last_stage": "done", "done": {}}
    if gpu:
        rt["cuda"] = {"libcuda": True, "device_count": devices, "driver_version": "12.8"}
        if devices == 0:
            rt["cuda"]["error"] = "no CUDA device visible"
    else:
        rt["cuda"] = {"libcuda": False, "device_count": 0, "error": "libcuda.so.1 not loadable"}
    rt["libs"] = {"torch": torch, "cupy": cupy, "kvikio": kvikio}
    if kvikio and kvikio_imports:
        rt["kvikio"] = {"importable": True, "version": "26.10.00"}
    elif kvikio:
        rt["kvikio"] = {"importable": False, "error": "ImportError: libcudart.so.12: cannot open shared object file"}
    else:
        rt["kvikio"] = {"importable": False, "error": "ModuleNotFoundError: No module named 'kvikio'"}
    if gpu and devices and kvikio and kvikio_imports:
        rt["cufile"] = ({"driver_open": True, "is_gds_available": gds_available, "allow_compat_mode": True,
                         "libcufile_version": "1.14"} if driver_open
                        else {"driver_open": False, "error": "RuntimeError: cuFile driver open failed (5030)"})
    else:
        rt["cufile"] = {"skipped": "no CUDA device"}
    return rt


def decide(root: Path, rt: dict, dev=NVME_PART, path=FILE) -> dict:
    facts = {"host": detect.host_facts(root), "file": detect.file_facts(path, root, dev=dev), "runtime": rt}
    return detect.decide(facts)


def avail(caps) -> set[str]:
    return {n for n, c in caps.items() if c.available}


def test_file_facts_resolve_partition_to_nvme_disk(tmp_path):
    r = fake_root(tmp_path)
    f = detect.file_facts(FILE, r, dev=NVME_PART)
    assert f["fs_type"] == "ext4" and f["mount_point"] == "/data"
    assert f["block_device"] == "nvme0n1" and f["driver"] == "nvme"
    v = detect.file_facts("/home/x", r, dev=VIRTIO)
    assert v["mount_point"] == "/" and v["block_device"] == "vda" and v["driver"] == "virtio_blk"


def test_host_facts_from_fake_tree(tmp_path):
    h = detect.host_facts(fake_root(tmp_path, p2p=True))
    assert h["nvidia_driver"].startswith("NVRM") and h["dev_nodes"] == ["nvidia0"]
    assert h["nvidia_fs"] == {"loaded": True, "version": "version: 2.24"}
    assert h["p2pdma"] == {"kernel_config": True, "p2pmem_devices": 1}
    assert h["run_udev"] is True and h["kernel"] == KERNEL
    assert h["libraries"]["libcufile"] == ["/usr/lib/x86_64-linux-gnu/libcufile.so.1.14.0"]


def test_full_gds_node_has_every_path(tmp_path):
    caps = decide(fake_root(tmp_path), runtime(torch=True))
    assert avail(caps) == {"cufile", "kvikio-compat", "bounce", "cpu"}
    assert caps["cufile"].detail["is_gds_available"] is True
    assert detect.Probe({}, caps).best() == "cufile"


def test_gpu_less_vm_has_only_cpu(tmp_path):
    caps = decide(fake_root(tmp_path, nvidia=False, nvfs=False, udev=False), runtime(gpu=False, kvikio=False))
    assert avail(caps) == {"cpu"}
    assert "libcuda" in caps["cufile"].reason and "/dev/nvidia" in caps["cufile"].reason
    assert "torch" in caps["bounce"].reason


def test_gpu_with_torch_but_no_kvikio(tmp_path):
    caps = decide(fake_root(tmp_path), runtime(kvikio=False, torch=True))
    assert avail(caps) == {"bounce", "cpu"}
    assert caps["bounce"].detail == {"array_library": "torch"}
    assert "KvikIO is not installed" in caps["kvikio-compat"].reason
    assert caps["cufile"].reason == caps["kvikio-compat"].reason


def test_kvikio_installed_but_broken_import(tmp_path):
    caps = decide(fake_root(tmp_path), runtime(kvikio_imports=False, cupy=True))
    assert avail(caps) == {"bounce", "cpu"}
    assert "installed but does not import" in caps["kvikio-compat"].reason
    assert "libcudart" in caps["kvikio-compat"].reason


def test_libcuda_but_no_device(tmp_path):
    caps = decide(fake_root(tmp_path), runtime(devices=0, torch=True))
    assert avail(caps) == {"cpu"}
    assert "no usable CUDA device" in caps["bounce"].reason


def test_virtio_disk_means_compat_only(tmp_path):
    r = fake_root(tmp_path)
    caps = decide(r, runtime(), dev=VIRTIO, path="/home/shard.bin")
    assert avail(caps) == {"kvikio-compat", "cpu"}
    assert "virtio_blk" in caps["cufile"].reason and "not NVMe" in caps["cufile"].reason


def test_missing_run_udev(tmp_path):
    caps = decide(fake_root(tmp_path, udev=False), runtime())
    assert "cufile" not in avail(caps) and "kvikio-compat" in avail(caps)
    assert "/run/udev" in caps["cufile"].reason


def test_p2pdma_stands_in_for_nvidia_fs(tmp_path):
    without = decide(fake_root(tmp_path / "a", nvfs=False), runtime())
    assert "nvidia-fs" in without["cufile"].reason
    with_p2p = decide(fake_root(tmp_path / "b", nvfs=False, p2p=True), runtime())
    assert with_p2p["cufile"].available


def test_tmpfs_file(tmp_path):
    caps = decide(fake_root(tmp_path, fs="tmpfs"), runtime())
    assert "tmpfs" in caps["cufile"].reason
    assert "odirect" in caps["cpu"].detail


def test_driver_open_failure_and_gds_unavailable(tmp_path):
    r = fake_root(tmp_path)
    assert "driver open failed" in decide(r, runtime(driver_open=False))["cufile"].reason
    assert "is_gds_available = false" in decide(r, runtime(gds_available=False))["cufile"].reason


HANG = textwrap.dedent("""
    import json, subprocess, sys, time
    print(json.dumps({"stage": "cuda", "event": "result", "result": {"libcuda": True, "device_count": 1}}))
    print(json.dumps({"stage": "cufile", "event": "start"}))
    child = subprocess.Popen(["sleep", "120"])
    print(json.dumps({"stage": "grandchild", "pid": child.pid}))
    print(json.dumps({"stage": "cufile", "event": "driver_open"}), flush=True)
    time.sleep(120)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie awaiting its parent (init) is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_hanging_child_is_killed_with_its_group(tmp_path):
    t0 = time.monotonic()
    rt = detect.runtime_facts(timeout_s=1.5, child_cmd=[sys.executable, "-c", HANG])
    assert time.monotonic() - t0 < 30
    assert rt["timed_out"] is True and rt["complete"] is False
    assert rt["last_stage"] == "cufile driver open"
    assert not _alive(rt["pid"])
    out = subprocess.run(["pgrep", "-f", "sleep 120", "-s", str(rt["pid"])], capture_output=True, text=True)
    assert out.stdout.strip() == ""
    caps = decide(fake_root(tmp_path), {**rt, "libs": {"kvikio": True}, "kvikio": {"importable": True}})
    assert not caps["cufile"].available
    assert "did not return within 1.5 s" in caps["cufile"].reason
    assert caps["kvikio-compat"].available  # the CUDA stage answered before the hang


def test_crashing_child_gives_a_reason():
    crash = "import json,sys; print(json.dumps({'stage':'cuda','event':'start'}), flush=True); " \
            "sys.stderr.write('Segmentation fault\\n'); sys.exit(139)"
    rt = detect.runtime_facts(timeout_s=10, child_cmd=[sys.executable, "-c", crash])
    assert rt["timed_out"] is False and "died in stage 'cuda'" in rt["error"] and "Segmentation" in rt["error"]
    caps = detect.decide({"host": {}, "file": {}, "runtime": rt})
    assert list(n for n, c in caps.items() if c.available) == ["cpu"]
    assert "died in stage" in caps["bounce"].reason


def test_real_probe_of_this_machine(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"x" * 10)
    before = set(sys.modules)
    pr = detect.probe(str(f), cache=False)
    assert pr.capabilities["cpu"].available
    assert pr.facts["runtime"]["complete"] is True
    assert pr.facts["file"]["path"] == str(f) and pr.facts["file"]["fs_type"]
    d = pr.to_dict()
    assert set(d["paths"]) == {"cufile", "kvikio-compat", "bounce", "cpu"} and d["best_path"] in d["paths"]
    # the probe never imports the GPU stacks into this process
    assert not {m for m in set(sys.modules) - before if m.split(".")[0] in ("kvikio", "torch", "cupy")}
    if not os.path.exists("/dev/nvidiactl"):
        assert d["best_path"] == "cpu"


BLOCKER = textwrap.dedent("""
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("kvikio", "torch", "cupy", "cupy_backends"):
                raise ImportError(f"blocked: {name}")
            return None
    sys.meta_path.insert(0, Block())
    import iobench.gds, iobench.gds.bench, iobench.gds.detect, iobench.gds.cpu, iobench.suite.gds
    import iobench.gds.bounce, iobench.gds.kvikio_paths, iobench.planner.gds, iobench.commands.gds
    from iobench.gds import open_reader
    r, eff, why = open_reader("cpu", sys.argv[1])
    buf = bytearray(5)
    assert r.read_into(buf, 0, 5) == 5 and bytes(buf) == b"hello", buf
    assert eff == "cpu" and why is None
    assert not [m for m in sys.modules if m.split(".")[0] in ("kvikio", "torch", "cupy")]
    print("ok")
""")


def test_imports_without_optional_packages(tmp_path):
    f = tmp_path / "h.bin"
    f.write_bytes(b"hello world")
    out = subprocess.run([sys.executable, "-c", BLOCKER, str(f)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_nvidia_fs_read_counter(tmp_path):
    r = fake_root(tmp_path)
    assert detect.nvfs_read_mib(r) is None  # no stats file
    (r / "proc/driver/nvidia-fs/stats").write_text(
        "GDS Version: 1.14.0.30\nNVFS statistics(ver: 4.0)\nActive Shadow-Buffer (MiB): 0\n"
        "Reads\t\t\t\t: n=4096 ok=4096 err=0 readMiB=2048 io_state_err=0\n"
        "Writes\t\t\t\t: n=0 ok=0 err=0 writeMiB=0 io_state_err=0\n")
    assert detect.nvfs_read_mib(r) == 2048
