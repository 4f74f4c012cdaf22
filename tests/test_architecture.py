"""The package layout as a test: no import cycles, and no module imports "upward".

Layers, bottom to top (README, "Architecture"):
  core      errors, config, units, paths, storage, wrappers, metrics, schema, results, manifest, io/*
  areas     formats, generate, verify, loader, tiers, checkpointing, gds, probe, planner, dist, mlperf, report
  suite     iobench/suite/* (the `iobench run` stages, built on the areas)
  commands  iobench/commands/* and cli (parse, config, call an area, print)

Every import counts, including those inside functions: a lazy import hides a cycle from
Python, not from the design.  The graph is read from the source (ast), so this test needs
nothing installed and cannot be fooled by import order.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ROOTS = {"iobench": "iobench", "iobench.formats": "formats", "iobench.checkpointing": "checkpointing",
         "iobench.gds": "gds"}
CORE = ("iobench.errors", "iobench.config", "iobench.units", "iobench.paths", "iobench.storage",
        "iobench.wrappers", "iobench.metrics", "iobench.schema", "iobench.results", "iobench.manifest", "iobench.format_registry", "iobench.io")
UPPER = ("iobench.loader", "iobench.tiers", "iobench.checkpointing", "iobench.gds", "iobench.report",
         "iobench.suite", "iobench.commands", "iobench.cli", "iobench.planner", "iobench.probe",
         "iobench.generate", "iobench.verify", "iobench.mlperf", "iobench.dist", "iobench.formats")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, d in ROOTS.items():
        for dp, _, files in os.walk(REPO / d):
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dp, f), REPO / d)[:-3].replace(os.sep, ".")
                if pkg == "iobench" and rel.split(".")[0] in ("formats", "checkpointing", "gds"):
                    continue
                name = pkg if rel == "__init__" else f"{pkg}.{rel.removesuffix('.__init__')}"
                out[name] = Path(dp) / f
    return out


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                base = ".".join(pkg[:len(pkg) - (n.level - 1)] + ([base] if base else []))
            cands = [base] + [f"{base}.{a.name}" for a in n.names]
        elif isinstance(n, ast.Import):
            cands = [a.name for a in n.names]
        else:
            continue
        for c in cands:
            while c and c not in mods:
                c = c.rpartition(".")[0]
            if c and c != name:
                found.add(c)
    return found


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, mods) for m, p in mods.items()}


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    counter = 0
    for root in g:
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(g.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _is(mod: str, prefixes) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def test_the_graph_is_read():
    g = _graph()
    assert "iobench.io.checksum" in g["iobench.generate"] and "iobench.storage" in g["iobench.wrappers"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_core_imports_nothing_above_it():
    bad = [f"{m} -> {d}" for m, deps in _graph().items() if _is(m, CORE) for d in deps if _is(d, UPPER)]
    assert bad == []


def test_only_the_cli_imports_commands_and_only_commands_import_the_suite():
    g = _graph()
    bad = [f"{m} -> {d}" for m, deps in g.items() for d in deps
           if (_is(d, ("iobench.commands",)) and not _is(m, ("iobench.commands", "iobench.cli")))
           or (_is(d, ("iobench.suite",)) and not _is(m, ("iobench.suite", "iobench.commands")))
           or (_is(d, ("iobench.report",)) and not _is(m, ("iobench.report", "iobench.suite", "iobench.commands")))]
    assert bad == []
