from __future__ import annotations


def register(sub) -> None:
    from ..cli import add_json_flag, add_set_flag

    p = sub.add_parser("plan", help="turn measured results and the seed's models into plans (prefetch depth, "
                                    "checkpoint interval, ...)")
    p.add_argument("model", nargs="?", metavar="MODEL", help="planner model (see --list)")
    p.add_argument("--list", action="store_true", help="list the models and their inputs")
    add_set_flag(p)
    p.add_argument("--from", dest="from_results", metavar="RESULTS.json",
                   help="take measured inputs from a results file (e.g. `iobench load --json`)")
    p.add_argument("--compute-ms", type=float, metavar="T", help="compute time per step in ms (sets compute_time)")
    add_json_flag(p)
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


def format_duration(s: float) -> str:
    from ..planner.models import format_seconds

    return format_seconds(s)


def format_value(name: str, v) -> str:
    """Human form of an output named in SI style (…_bytes, …_s, …_ratio, …_usd…)."""
    from ..units import format_bytes, format_rate, format_seconds

    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, list):
        return ", ".join(format_value(name, x) for x in v[:8]) + (" …" if len(v) > 8 else "")
    if not isinstance(v, (int, float)):
        return str(v)
    if name.endswith("bytes_per_s"):
        return format_rate(v)
    if "bytes" in name and "per_param" not in name and not name.endswith("_ratio"):
        return format_bytes(v)
    if name.endswith("_s") and not name.endswith("_per_s"):
        return format_duration(v)
    if name.endswith("_ratio") or name.startswith("p_") or name.startswith("utilization"):
        return f"{v:.2%}"
    if "usd" in name:
        return f"${v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.4g}"


def format_input(kind: str, v) -> str:
    from ..units import format_bytes, format_rate

    if isinstance(v, list):
        return ", ".join(format_input(kind, x) for x in v) or "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v) if v != "" else "-"
    return {"size": format_bytes, "rate": format_rate, "duration": format_duration,
            "ratio": lambda x: f"{x:.2%}"}.get(kind, lambda x: f"{x:,}" if isinstance(x, int) else f"{x:.4g}")(v)


def print_plan(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"plan {result['model']}: {result['summary']}")
    t.add_column("", style="dim")
    t.add_column("name")
    t.add_column("value", justify="right")
    t.add_column("from", style="dim")
    from ..planner.models import get_model

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
