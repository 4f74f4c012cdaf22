"""Every flag that names a path is declared to the output guard (iobench.guard), so a new
command or flag cannot skip it: a flag whose metavar or name says "path" must be in its
parser's ``io_paths`` (as an output, an input, a root, a work directory or, explicitly, not a
path), and every declaration names a real flag."""

from __future__ import annotations

import argparse

import pytest

from iobench.cli import build_parser
from iobench.guard import OUTPUT_ROLES

PATH_METAVARS = {"PATH", "FILE", "DIR", "URL", "DATASET_URL", "RESULTS.json", "A.json", "B.json", "TRACE",
                 "FILE|DATASET_DIR", "[TIER=]URL", "NAME|FILE"}
PATH_DESTS = {"json", "markdown", "junit", "trace", "out", "html", "file", "target", "dataset", "url", "urls",
              "tiers", "config", "workload", "catalog", "local", "durable", "from_results", "compute"}
NOT_PATHS = {"endpoint_url"}   # an S3 endpoint, not a place iobench reads or writes files


def _leaves(p: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield prefix, p
        return
    for a in subs:
        for name, sp in a.choices.items():
            yield from _leaves(sp, prefix + (name,))


LEAVES = [(" ".join(k), p) for k, p in _leaves(build_parser()) if k]


def _path_actions(p):
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction)) or a.dest in NOT_PATHS:
            continue
        if a.nargs == 0:
            continue   # a switch
        if (a.metavar in PATH_METAVARS) or a.dest in PATH_DESTS:
            yield a


@pytest.mark.parametrize("name,parser", LEAVES, ids=[n for n, _ in LEAVES])
def test_every_path_flag_is_declared_to_the_guard(name, parser):
    declared = {f.dest for f in parser.get_default("io_paths") or ()}
    missing = [a.option_strings[0] if a.option_strings else a.dest for a in _path_actions(parser)
               if a.dest not in declared]
    assert not missing, f"`iobench {name}`: declare {missing} with iobench.guard.declare"


@pytest.mark.parametrize("name,parser", LEAVES, ids=[n for n, _ in LEAVES])
def test_every_declaration_names_a_flag_and_outputs_come_with_force(name, parser):
    dests = {a.dest for a in parser._actions}
    decl = parser.get_default("io_paths") or ()
    for f in decl:
        assert f.dest in dests, f"`iobench {name}` declares {f.dest!r}, which is no flag of it"
    if any(f.role in OUTPUT_ROLES for f in decl):
        assert "--force" in parser._option_string_actions, f"`iobench {name}` has outputs but no --force"
