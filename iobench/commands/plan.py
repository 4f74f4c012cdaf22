from __future__ import annotations


def register(sub) -> None:
    from .. import guard
    from ..cli import add_json_flag, add_set_flag

    p = sub.add_parser("plan", help="turn measured results and the domain models' models into plans (prefetch depth, "
                                    "checkpoint interval, ...)")
    p.add_argument("model", nargs="?", metavar="MODEL", help="planner model (see --list)")
    p.add_argument("--list", action="store_true", help="list the models and their inputs")
    add_set_flag(p)
    p.add_argument("--from", dest="from_results", metavar="RESULTS.json",
                   help="take measured inputs from a results file (e.g. `iobench load --json`)")
    p.add_argument("--compute-ms", type=float, metavar="T", help="compute time per step in ms (sets compute_time)")
    add_json_flag(p)
    guard.declare(p, guard.in_file("from_results", "--from"))
    p.set_defaults(func=run)


def _list() -> int:
    from ..planner.models import MODELS, REQUIRED

    for m in MODELS.values():
        print(f"{m.name}: {m.summary}")
        for prm in m.params:
            default = "required" if prm.default is REQUIRED else f"default {prm.default!r}"
            src = f"; --from {', '.join(prm.sources)}" if prm.sources else ""
            print(f"    {prm.name} ({prm.kind}, {default}): {prm.help}{src}")
    return 0


def print_plan(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"plan {result['model']}: {result['summary']}")
    t.add_column("", style="dim")
    t.add_column("name")
    t.add_column("value", justify="right")
    t.add_column("from", style="dim")
    from ..planner.models import get_model
    from ..report.format import format_input, format_value

    model = get_model(result["model"])
    tables: list = []
    for k, v in result["inputs"].items():
        t.add_row("input", k, format_input(model.param(k).kind, v), result["inputs_from"][k])
    for k, v in result["outputs"].items():
        if k == "overhead_table":
            for row in v:
                t.add_row("output", f"overhead at {format_value('x_s', row['interval_s'])}",
                          format_value("x_ratio", row["total_ratio"]), "")
            continue
        if isinstance(v, list) and v and all(isinstance(r, dict) for r in v):
            tables.append((k, v))   # printed as their own tables below
            continue
        t.add_row("output", k, format_value(k, v), "")
    con = Console()
    con.print(t)
    for name, rows in tables:
        sub = Table(title=name)
        for col in rows[0]:
            sub.add_column(col, justify="right")
        for r in rows:
            sub.add_row(*[format_value(c, r.get(c)) for c in rows[0]])
        con.print(sub)
    if result["recommendation"]:
        con.print(f"[bold]recommendation:[/bold] {result['recommendation']}")


def run(args) -> int:
    from ..config import parse_set
    from ..errors import ConfigError
    from ..planner.models import plan
    from ..results import Results

    if args.list:
        return _list()
    if not args.model:
        raise ConfigError("MODEL", "no planner model given", "see `iobench plan --list`")
    overrides = parse_set(args.set)
    for k, v in overrides.items():
        if isinstance(v, dict):
            raise ConfigError(f"--set {k}", "planner inputs are flat names", "use --set name=value (no dots)")
    if args.compute_ms is not None:
        if args.compute_ms <= 0:
            raise ConfigError("--compute-ms", f"must be positive, got {args.compute_ms}", "give e.g. 200")
        overrides.setdefault("compute_time", args.compute_ms / 1000)
    results = None
    if args.from_results:
        from ..report.build import load

        # A run.json brings its stage results files; each is searched for the measured inputs.
        results = [d for _, d in load([args.from_results])]
    result = plan(args.model, overrides, results)
    print_plan(result)
    if args.json:
        Results(command="plan", config={"model": args.model, "set": overrides, "from": args.from_results},
                metrics={"plan": result}).write(args.json)
    return 0
