"""The output guard: nothing a command reads, and nothing iobench did not write, is overwritten.

Each command declares the paths its flags name, and what each is to it (``declare``, next to
its ``add_argument`` calls; ``add_json_flag`` declares ``--json`` itself).  A declaration is a
``PathFlag``: the flag, and its ``Role`` — an output file or directory, an input file, a
dataset root, a tiers file (which brings its tier roots and catalog), a root the command both
reads and writes (checkpoint tiers), or a work directory.  ``check(args)`` runs in
``iobench.cli.main`` before the command does anything and refuses (``ConfigError``, exit 2,
one line naming both flags):

1. an output that *is*, or lies inside, any input of the same command: a dataset root or one
   of its files, a tier root, the catalog, a checkpoint root, a results/config/trace file read
   (``verify DS --json DS/manifest.json``, ``compare A B --json A``);
2. two outputs at one path, or an output file inside an output directory of the same command
   (``gen --out DS --json DS/manifest.json``);
3. roots that overlap: every pair of dataset roots, read-write roots and output directories
   must be neither the same nor nested (``ckpt --local D --durable D/x``).  The rule itself is
   ``iobench.paths.check_disjoint``; ``TiersConfig`` holds its tiers to it and the checkpointer
   its two tiers, so code that builds them without the CLI is held to it too;
4. an existing output file that iobench did not write, unless ``--force``: iobench's own files
   are recognised by content (results by ``schema_version`` + ``command``, Markdown and JUnit
   by their first line, traces by their header record, tiers files by the comment
   ``tiers init`` writes); an empty file is nobody's work and may be replaced.  A report
   directory's ``report.html``/``report.md`` and a ``gen --out`` directory that is not empty
   and holds no dataset iobench generated are refused the same way (``gen --force`` still never
   overwrites a file it did not write: ``iobench.generate`` checks each name).

A test (``tests/test_guard_declarations.py``) walks every parser and fails when a flag that
names a path is not declared, so a new command cannot forget.  Only local paths are compared;
URLs (``s3://``) are left to their backends.
"""

from __future__ import annotations

import argparse
import enum
import os
from dataclasses import dataclass

from .errors import ConfigError
from .paths import Held, check_disjoint, is_local, real, within

FORCE_HELP = ("replace an existing output file that iobench did not write (its own results, reports and "
              "traces are recognised and replaced without it); never an input of the command")


class Role(enum.Enum):
    OUT_FILE = "output file"
    OUT_DIR = "output directory"
    IN_FILE = "input file"
    IN_DATASET = "dataset"          # a dataset root (or a single data file for `gds bench`)
    IN_TIERS = "tiers file"         # the file, its local tier roots and its catalog
    ROOT = "root"                   # read and written by the command (checkpoint tiers, tier dirs at init)
    WORK = "work directory"         # the command makes and removes its own subdirectory there (check, probe)
    NOT_A_PATH = "not a path"       # a flag whose metavar looks like a path but names something else


INPUT_ROLES = (Role.IN_FILE, Role.IN_DATASET, Role.IN_TIERS, Role.ROOT)
OUTPUT_ROLES = (Role.OUT_FILE, Role.OUT_DIR)


@dataclass(frozen=True)
class PathFlag:
    dest: str
    flag: str
    role: Role
    owner: str = ""                  # OUT_FILE/OUT_DIR: what iobench writes there (a key of RECOGNISERS / DIR_OWNERS)
    inside_ok: tuple[str, ...] = ()  # input dests this output may lie inside (index --out inside its dataset)
    prefix: str = ""                 # only values starting with it name a path, after it (`--compute file:PATH`)
    must_exist: bool = True          # IN_FILE: refused when missing (False: a file the command may create)

    def paths(self, args) -> list[str]:
        """The local paths this flag names in ``args`` (none for URLs, '-' and unset flags)."""
        v = getattr(args, self.dest, None)
        vals = v if isinstance(v, (list, tuple)) else [v]
        out = []
        for x in vals:
            if not isinstance(x, (str, os.PathLike)):
                continue
            x = str(x)
            if self.prefix:
                if not x.startswith(self.prefix):
                    continue
                x = x[len(self.prefix):]
            if x and x != "-" and is_local(x):
                out.append(x)
        return out


def declare(parser: argparse.ArgumentParser, *flags: PathFlag) -> None:
    """Record ``flags`` on ``parser`` (they reach ``check`` as ``args.io_paths``); a parser with an
    output gets ``--force`` unless it has its own."""
    have = tuple(parser.get_default("io_paths") or ())
    mine = {f.dest for f in flags}
    parser.set_defaults(io_paths=tuple(f for f in have if f.dest not in mine) + tuple(flags))
    if any(f.role in OUTPUT_ROLES for f in flags) and "--force" not in parser._option_string_actions:
        parser.add_argument("--force", action="store_true", help=FORCE_HELP)


def out_file(dest: str, flag: str, owner: str = "results", inside_ok: tuple[str, ...] = ()) -> PathFlag:
    return PathFlag(dest, flag, Role.OUT_FILE, owner, inside_ok)


def out_dir(dest: str, flag: str, owner: str = "") -> PathFlag:
    return PathFlag(dest, flag, Role.OUT_DIR, owner)


def in_file(dest: str, flag: str, prefix: str = "", must_exist: bool = True) -> PathFlag:
    return PathFlag(dest, flag, Role.IN_FILE, prefix=prefix, must_exist=must_exist)


def dataset(dest: str, flag: str) -> PathFlag:
    return PathFlag(dest, flag, Role.IN_DATASET)


def tiers_file(dest: str = "tiers", flag: str = "--tiers") -> PathFlag:
    return PathFlag(dest, flag, Role.IN_TIERS)


def root(dest: str, flag: str) -> PathFlag:
    return PathFlag(dest, flag, Role.ROOT)


def work(dest: str, flag: str) -> PathFlag:
    return PathFlag(dest, flag, Role.WORK)


def not_a_path(dest: str, flag: str) -> PathFlag:
    return PathFlag(dest, flag, Role.NOT_A_PATH)


# ---- recognising iobench's own files ------------------------------------------------------

_HEAD = 4096


def _head(path: str) -> bytes:
    from .io.inputs import open_regular

    fd = open_regular(path, "output")
    try:
        return os.read(fd, _HEAD)
    finally:
        os.close(fd)


def _is_results(path: str) -> bool:
    from .io.inputs import MAX_RESULTS_BYTES, loads_json, read_bytes

    try:
        data = loads_json(read_bytes(path, "output", MAX_RESULTS_BYTES))
    except (ValueError, ConfigError):
        return False
    return isinstance(data, dict) and "schema_version" in data and isinstance(data.get("command"), str)


def _is_manifest(path: str) -> bool:
    from .io.inputs import loads_json, read_bytes

    try:
        data = loads_json(read_bytes(path, "output", 1 << 30))
    except (ValueError, ConfigError):
        return False
    return isinstance(data, dict) and "shards" in data and "format" in data and "modality" in data


def _first_line(path: str) -> str:
    return _head(path).split(b"\n", 1)[0].decode("utf-8", "replace").strip()


def _is_markdown(path: str) -> bool:
    return _first_line(path).startswith("# iobench")


def _is_junit(path: str) -> bool:
    return b'<testsuites name="iobench' in _head(path)


def _is_trace(path: str) -> bool:
    from .io.inputs import loads_json

    try:
        rec = loads_json(_first_line(path))
    except ValueError:
        return False
    return isinstance(rec, dict) and rec.get("type") == "header" and "version" in rec


def _is_tiers_file(path: str) -> bool:
    from .tiers.config import TIERS_FILE_MARK

    return _first_line(path).startswith(TIERS_FILE_MARK)


def _is_report_md(path: str) -> bool:
    return b" results file(s); plots are in [" in _head(path)   # the line under the title report.md starts with


def _is_report_html(path: str) -> bool:
    return b'<meta name="generator" content="iobench' in _head(path)


RECOGNISERS = {"results": _is_results, "manifest": _is_manifest, "markdown": _is_markdown, "junit": _is_junit,
               "trace": _is_trace, "tiers": _is_tiers_file, "report.html": _is_report_html,
               "report.md": _is_report_md}
WHAT = {"results": "an iobench results file", "manifest": "an iobench manifest", "markdown": "iobench Markdown",
        "junit": "iobench JUnit XML", "trace": "an iobench access trace", "tiers": "a tiers file iobench wrote",
        "report.html": "an iobench report", "report.md": "an iobench report summary"}


def written_by_iobench(path: str, owner: str) -> bool:
    """Whether the existing regular file ``path`` is iobench's own output of kind ``owner``."""
    try:
        if os.path.getsize(path) == 0:
            return True   # an empty file (mktemp) holds nothing to lose
        return RECOGNISERS[owner](path)
    except (OSError, ConfigError):
        return False


def refuse_foreign_file(path: str, flag: str, owner: str, force: bool) -> None:
    """ConfigError when ``path`` exists, is a regular file and is not iobench's ``owner`` output."""
    if force or not os.path.isfile(path) or written_by_iobench(path, owner):
        return
    raise ConfigError(flag, f"{path} exists and is not {WHAT.get(owner, 'a file iobench wrote')}: replacing it "
                      "would lose it", "give a new path, or add --force to replace it")


# ---- directories an output may own -----------------------------------------------------

def _dataset_dir_ok(path: str, flag: str, force: bool) -> None:
    """``gen --out``: an absent or empty directory, or one holding a dataset iobench generated."""
    from .generate import foreign_dataset_dir

    why = foreign_dataset_dir(path)
    if why and not force:
        raise ConfigError(flag, f"{path} {why}", "give an empty or new directory, or add --force to write beside "
                          "those files: none of them is ever overwritten")


def _report_dir_ok(path: str, flag: str, force: bool) -> None:
    for name in ("report.html", "report.md"):
        refuse_foreign_file(os.path.join(path, name), flag, name, force)


DIR_OWNERS = {"dataset": _dataset_dir_ok, "report": _report_dir_ok}


# ---- relations between paths -----------------------------------------------------------

def _tier_inputs(path: str, flag: str) -> list[Held]:
    from .tiers.config import load_tiers

    if not os.path.isfile(path):
        return []   # the command reports a missing file in its own words
    cfg = load_tiers(path, flag)
    out = []
    for t in cfg.tiers:
        if is_local(t.url):
            out.append(Held(f"tier {t.name!r} of {flag}", "tiers", real(t.url), t.url))
    out.append(Held(f"the catalog of {flag}", "tiers", real(cfg.catalog), cfg.catalog))
    return out


def check(args) -> None:
    """The guard over ``args.io_paths`` (see the module docstring); a no-op for undeclared commands."""
    decl: tuple[PathFlag, ...] = tuple(getattr(args, "io_paths", None) or ())
    force = bool(getattr(args, "force", False))
    inputs: list[Held] = []
    roots: list[Held] = []
    outputs: list[tuple[PathFlag, Held]] = []
    for pf in decl:
        for v in pf.paths(args):
            h = Held(pf.flag, pf.dest, real(v), v)
            if pf.role is Role.IN_FILE:
                if os.path.lexists(h.path) or not pf.must_exist:
                    inputs.append(Held(h.label, h.dest, h.path, h.given, tree=False))
            elif pf.role is Role.IN_DATASET or pf.role is Role.ROOT:
                inputs.append(h)
                roots.append(h)
            elif pf.role is Role.IN_TIERS:
                inputs.append(h)
                inputs.extend(_tier_inputs(h.path, pf.flag))
            elif pf.role in OUTPUT_ROLES:
                outputs.append((pf, h))
                if pf.role is Role.OUT_DIR:
                    roots.append(h)
    for pf, o in outputs:
        for i in inputs:
            if i.dest in pf.inside_ok:
                if i.tree and within(o.path, i.path) and os.path.isfile(o.path) \
                        and not written_by_iobench(o.path, pf.owner):
                    # `index DS --out DS/a.tar --force`: --force replaces iobench's files, never the data
                    raise ConfigError(pf.flag, f"{o.given} is a file of {i.label} ({i.given}), not "
                                      f"{WHAT.get(pf.owner, 'a file iobench wrote')}", "give a new path")
                continue
            if o.path == i.path or (i.tree and within(o.path, i.path)):
                how = "is" if o.path == i.path else "lies inside"
                raise ConfigError(pf.flag, f"{o.given} {how} {i.label} ({i.given}), an input of this command: "
                                  "writing there would destroy it", "give an output path outside every input")
    for n, (pf, o) in enumerate(outputs):
        for qf, q in outputs[:n]:
            if o.path == q.path:
                raise ConfigError(pf.flag, f"{o.given} is also {qf.flag}", "give each output its own path")
    for pf, o in outputs:
        for qf, q in outputs:
            if pf.role is Role.OUT_FILE and qf.role is Role.OUT_DIR and within(o.path, q.path):
                # `gen --out DS --json DS/manifest.json`: the file would replace what the directory's writer makes
                raise ConfigError(pf.flag, f"{o.given} lies inside {qf.flag} ({q.given}), which this command fills",
                                  "write it outside that directory")
    check_disjoint(roots)
    for pf, o in outputs:
        if pf.role is Role.OUT_FILE and pf.owner:
            refuse_foreign_file(o.path, pf.flag, pf.owner, force)
        elif pf.role is Role.OUT_DIR and pf.owner and os.path.isdir(o.path):
            DIR_OWNERS[pf.owner](o.path, pf.flag, force)
