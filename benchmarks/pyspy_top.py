"""A short Markdown summary of a py-spy profile: where the samples are, by process and function.

Record the whole process tree of a command (the loader's workers included), then summarise:

    .venv/bin/py-spy record --subprocesses --format raw -r 100 -o load.raw -- \\
        .venv/bin/iobench load DATASET --access block -W 1 -B 256 --cache warm --epochs 2
    .venv/bin/python benchmarks/pyspy_top.py load.raw --title "raw tokens, warm, W=1" >> reports/reference/profiles.md

``--format raw`` is the collapsed-stack format (one ``frame;frame;... COUNT`` line per
stack); each line's first frame names the process.  The summary lists, per process role
(parent, worker), the functions with the most samples on top of the stack (self) and in
the stack (inclusive), file paths cut to the package.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

_FRAME = re.compile(r" \((?:/[^)]*/)?(?:site-packages/|iobench/|formats/|checkpointing/)?([^)]+?)(?::\d+)?\)$")


def _clean(frame: str) -> str:
    return _FRAME.sub(lambda m: f" ({m.group(1)})", frame.strip())


def summarize(lines, top: int = 8) -> dict:
    by_proc: dict[str, dict] = {}
    pids: dict[str, str] = {}
    for line in lines:
        line = line.rstrip()
        if not line:
            continue
        stack, _, n = line.rpartition(" ")
        frames = stack.split(";")
        proc = frames[0]
        pid = m.group(1) if (m := re.search(r"process (\d+)", proc)) else proc
        role = "worker" if any("run_worker" in f for f in frames) else "parent"
        if role == "parent" and len(pids) and pid not in pids and any("BaseProcess._bootstrap" in f for f in frames):
            role = "child"
        pids.setdefault(pid, role)
        d = by_proc.setdefault(role, {"samples": 0, "self": collections.Counter(), "incl": collections.Counter()})
        d["samples"] += int(n)
        # a forked worker's stack starts with the parent's frames above fork()
        frames = frames[next(i for i, f in enumerate(frames) if "run_worker" in f):] if role == "worker" else frames[1:]
        body = [_clean(f) for f in frames if not f.startswith("process ")]
        if body:
            d["self"][body[-1]] += int(n)
            for f in set(body):
                d["incl"][f] += int(n)
    return {"total": sum(d["samples"] for d in by_proc.values()), "roles": by_proc, "top": top}


def _share_table(head: str, counts: list[tuple[str, int]], samples: int) -> list[str]:
    return ["", f"| {head} | function |", "|---:|---|", *(f"| {100 * c / samples:.1f} | `{f}` |" for f, c in counts)]


def markdown(s: dict, title: str) -> str:
    out = [f"### {title}", "", f"{s['total']} samples over all processes."]
    for role, d in sorted(s["roles"].items(), key=lambda kv: -kv[1]["samples"]):
        out += ["", f"**{role}** ({d['samples']} samples, {100 * d['samples'] / max(1, s['total']):.0f}%): "
                    "self time, then inclusive"]
        incl = [(f, c) for f, c in d["incl"].most_common(s["top"] * 4)
                if not any(k in f for k in ("<module>", "_bootstrap", "runpy", "_run_code", "Thread.run"))]
        out += _share_table("self %", d["self"].most_common(s["top"]), d["samples"])
        out += _share_table("incl. %", incl[:s["top"]], d["samples"])
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="py-spy --format raw output")
    ap.add_argument("--title", default="profile")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    with open(args.raw) as f:
        print(markdown(summarize(f, args.top), args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
