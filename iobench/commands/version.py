from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("version", help="print the iobench version")
    p.set_defaults(func=run)


def run(args) -> int:
    from .._version import __version__

    print(f"iobench {__version__}")
    return 0
