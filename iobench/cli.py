"""The `iobench` command line.

Each subcommand lives in its own module under ``iobench/commands/`` and defines
``register(subparsers)``, which adds its parser and sets ``func`` to a function taking
the parsed arguments and returning an exit code.  Command modules import heavy packages
inside their functions so that ``iobench --help`` stays fast.

Exit codes: 0 success; 1 a measured failure (corruption, a failed check); 2 bad input
(one line naming the field and the fix; a traceback only with ``--debug``).
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys

from . import commands
from ._version import __version__
from .errors import IobenchError, UsageError


class Parser(argparse.ArgumentParser):
    """argparse, but bad flags give one line and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def add_json_flag(p: argparse.ArgumentParser) -> None:
    from .guard import declare, out_file

    p.add_argument("--json", metavar="PATH",
                   help="write the results (schema in README) to this file; '-': to stdout (the text goes to stderr)")
    declare(p, out_file("json", "--json"))


def add_progress_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress", action="store_true", default=None, help="show progress even when stderr is not a TTY")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress display")


def want_progress(args) -> bool:
    """Progress on stderr: on by default on a terminal, off in logs; --progress/--no-progress decide."""
    flag = getattr(args, "progress", None)
    return sys.stderr.isatty() if flag is None else bool(flag)


def add_endpoint_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint-url", metavar="URL",
                   help="S3-compatible endpoint (default: $AWS_ENDPOINT_URL, then AWS)")


def add_storage_option_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="fsspec storage option for the URL's filesystem (repeatable), e.g. anon=true; "
                        "credentials belong in the environment or profiles, not here")


def add_set_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override any config key (repeatable)")


class _PipeSafeStdout:
    """stdout that survives a reader going away (`iobench compare ... --json x.json | head -1`):
    later output is dropped instead of a BrokenPipeError aborting the command before it has
    written its files."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, s: str) -> int:
        try:
            return self._stream.write(s)
        except BrokenPipeError:
            self._stream = open(os.devnull, "w")
            return len(s)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._stream = open(os.devnull, "w")

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _RedactingStream:
    """A console stream (stdout, stderr) whose every write goes through ``redact_text``: the one mask
    for everything printed, verdict lines, rich tables, warnings and ``--debug`` tracebacks alike
    (the interpreter prints an uncaught exception to ``sys.stderr``, which is this)."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, s: str) -> int:
        from .results import redact_text

        self._stream.write(redact_text(s) if isinstance(s, str) else s)
        return len(s)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _mask_console() -> None:
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _RedactingStream):
            setattr(sys, name, _RedactingStream(stream))


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, CI runners and ``timeout`` send), raised in the main thread exactly as Ctrl-C
    raises KeyboardInterrupt: every clean-up that Ctrl-C runs (scratch datasets, temp files, worker
    processes, servers) runs for it too, and the command exits 143 with one line."""


def _sigterm_like_sigint():
    """Install the SIGTERM handler; returns the previous one (``main`` puts it back)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    main_pid = os.getpid()

    def on_term(signum, frame):
        if os.getpid() != main_pid:   # a forked worker inherited this handler: die as SIGTERM means
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # one is enough: a second must not cut the clean-up short
        raise Terminated()

    _redeliver_swallowed_signals(on_term, main_pid)
    return signal.signal(signal.SIGTERM, on_term)


def _redeliver_swallowed_signals(on_term, main_pid: int) -> None:
    """A signal's exception raised where Python cannot raise (a fork hook, ``__del__``, a weakref
    callback) is printed as "Exception ignored in ..." and dropped: a SIGTERM that arrived while
    ``gen`` forked its writers was lost (its handler already set to ignore a second), and the run
    went on to the end, exit 0.  Python hands such exceptions to ``sys.unraisablehook``: there the
    signal is sent again, a moment later from a timer thread (sent from the hook, Python would run the
    handler inside the hook at once, and drop it again), to be raised where it can be."""
    import contextlib
    import signal
    import threading

    previous = sys.unraisablehook
    if getattr(previous, "_iobench_redelivers", False):
        return

    def hook(unraisable) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt) and os.getpid() == main_pid:
            sig = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
            if sig == signal.SIGTERM:
                with contextlib.suppress(ValueError):    # (ValueError: not the main thread; it stays ignored)
                    signal.signal(signal.SIGTERM, on_term)   # it ignored SIGTERM before raising: arm it again
            timer = threading.Timer(0.05, os.kill, (main_pid, sig))
            timer.daemon = True
            timer.start()
            return
        previous(unraisable)

    hook._iobench_redelivers = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


def build_parser() -> Parser:
    parser = Parser(prog="iobench", description="Storage and data-pipeline benchmarking for ML training.",
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--version", action="version", version=f"iobench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in _command_names():
        importlib.import_module(f"{commands.__name__}.{name}").register(sub)
    return parser


def _command_names() -> list[str]:
    """The command modules, one per subcommand, found by listing ``iobench/commands/``.

    (Not ``pkgutil.iter_modules``: it imports ``inspect``, ~25 ms of every start-up.)
    """
    names = set()
    for folder in commands.__path__:
        for entry in os.listdir(folder):
            stem, ext = os.path.splitext(entry)
            if stem.startswith("_") or not stem.isidentifier():
                continue
            if ext == ".py" or (not ext and os.path.isfile(os.path.join(folder, entry, "__init__.py"))):
                names.add(stem)
    return sorted(names)


_PATH_ERRNOS = {errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EROFS, errno.ENOENT, errno.ELOOP,
                errno.ENAMETOOLONG, errno.EEXIST}


def _as_typed(e: UsageError, parser, args, argv: list[str] | None) -> str:
    """The error's text, naming the flag the user typed when the field is the config key it set:
    ``gen.format: unknown value`` after ``--format bogus`` reads ``--format (gen.format): ...``."""
    field = getattr(e, "field", "") or ""
    section, dot, key = field.rpartition(".")
    if not dot or not section or not key.isidentifier():
        return str(e)
    from .bounds import chosen

    typed = list(sys.argv[1:] if argv is None else argv)
    # the flag's dest: KEY, cfg_KEY (probe's flags), or PARENT_KEY (tiers.nvme.capacity <- --nvme-capacity)
    dests = (key, f"cfg_{key}", f"{section.rpartition('.')[2]}_{key}")
    for _cmd, p in chosen(parser, args):
        for a in p._actions:
            if a.dest not in dests or not a.option_strings:
                continue
            if any(t == o or t.startswith(o + "=") for t in typed for o in a.option_strings if o.startswith("--")):
                flag = max(a.option_strings, key=len)
                return f"{flag} ({field}): {str(e)[len(field) + 2:]}" if str(e).startswith(field + ": ") else str(e)
    return str(e)


def _one_line(msg: str) -> str:
    """An error line as printed: credentials in URLs masked, newlines (YAML errors) folded."""
    from .results import redact_text

    line = " ".join(redact_text(msg).split())
    if len(line) > _MAX_LINE:   # a value quoted whole (a 100 000-character line of a user's file): keep both ends
        line = line[:_MAX_LINE * 2 // 3] + " [...] " + line[-_MAX_LINE // 3:]
    return line


_MAX_LINE = 900


def _mask_secrets_in_logs() -> None:
    """Every log record (warnings on stderr included) is made with URL credentials masked."""
    import logging

    old = logging.getLogRecordFactory()
    if getattr(old, "_iobench_redacts", False):
        return

    def factory(*a, **kw):
        from .results import redact_text

        record = old(*a, **kw)
        msg = record.getMessage()
        clean = redact_text(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            # a traceback (log.exception) quotes the exception's text: the formatter uses exc_text as made here
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return record

    factory._iobench_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def main(argv: list[str] | None = None) -> int:
    import signal

    previous = _sigterm_like_sigint()
    try:
        return _main(argv)
    except Terminated:   # before the command started (parsing, imports): nothing to clean up yet
        sys.stderr.write("iobench: terminated (SIGTERM) before the command started\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write("iobench: interrupted before the command started\n")
        return 130
    finally:
        if argv is None:
            _end_quietly_on_signal()   # the process itself: what is left is its teardown
        elif previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _end_quietly_on_signal() -> None:
    """After the command has returned, Ctrl-C or SIGTERM ends the process at once, with one line: the
    interpreter's teardown (thread joins, atexit hooks of the S3 client) would otherwise print a
    KeyboardInterrupt traceback, or die of the default SIGTERM with no line at all."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def on_signal(signum, frame):
        try:
            sys.stdout.flush()
            name = "SIGINT" if signum == signal.SIGINT else "SIGTERM"
            sys.stderr.write(f"iobench: {name} while exiting; the command had finished and its files are "
                             "complete\n")
            sys.stderr.flush()
        finally:
            os._exit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def _main(argv: list[str] | None) -> int:
    from .results import register_secrets

    register_secrets(list(sys.argv[1:] if argv is None else argv))
    if sys.stdout is sys.__stdout__:
        sys.stdout = _PipeSafeStdout(sys.stdout)
    _mask_console()   # before parsing: argparse's own error lines quote what was typed
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    import contextlib

    from . import results

    _mask_secrets_in_logs()
    results.begin()
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        # rich wraps tables at 80 columns when stdout is a pipe (CI logs): give them room instead
        os.environ["COLUMNS"] = "200"
    json_to_stdout = getattr(args, "json", None) == "-"
    try:
        from . import guard
        from .bounds import check_flags
        from .preflight import check_args

        check_flags(parser, args)   # every numeric flag within its bound (iobench.bounds), before any work
        if getattr(args, "endpoint_url", None) is not None:   # ('': an unset shell variable, refused too)
            from .storage import check_endpoint_url

            # here, not when a backend opens: `tiers init` writes the URL into a file and never connects, and a
            # command whose paths are all local would otherwise accept user:password@ without a word
            check_endpoint_url(args.endpoint_url)
        check_args(args)   # refuse before work: every declared path can be used as what it is
        guard.check(args)  # ... and no output lands on an input, a foreign file or an overlapping root
        with contextlib.ExitStack() as stack:
            if json_to_stdout:
                # `--json -`: the results document is the only thing on stdout; every other line goes to stderr
                results.set_json_stream(sys.stdout)
                stack.enter_context(contextlib.redirect_stdout(sys.stderr))
            return int(args.func(args) or 0)
    except UsageError as e:
        if args.debug:
            raise
        sys.stderr.write(_one_line(f"iobench {args.command}: error: {_as_typed(e, parser, args, argv)}") + "\n")
        _end_world(e)
        return 2
    except IobenchError as e:
        if args.debug:
            raise
        sys.stderr.write(_one_line(f"iobench {args.command}: {type(e).__name__}: {e}") + "\n")
        _end_world(e)
        return e.exit_code
    except Terminated:
        sys.stderr.write(f"iobench {args.command}: terminated (SIGTERM); cleaned up what this run had started\n")
        return 143
    except KeyboardInterrupt:
        sys.stderr.write(f"iobench {args.command}: interrupted; cleaned up what this run had started\n")
        return 130
    except SystemExit:
        raise
    except OSError as e:
        # A safety net under the up-front checks: a path the user gave that cannot be used is
        # still one line, never a traceback; exit 2 when the cause is the path (permissions, kind).
        if args.debug:
            raise
        what = f"{e.strerror or e}: {e.filename}" if e.filename else f"{type(e).__name__}: {e}"
        sys.stderr.write(_one_line(f"iobench {args.command}: error: {what}") + "\n")
        _end_world(e)
        return 2 if e.errno in _PATH_ERRNOS else 1
    except BaseException as e:
        if _in_mpi_world():
            import traceback

            traceback.print_exc()   # the abort below ends this process before Python could print it
            _end_world(e)
        raise


def _in_mpi_world() -> bool:
    if "iobench.dist.world" not in sys.modules:
        return False
    from .dist.world import current_world

    w = current_world()
    return w is not None and w.is_mpi and w.size > 1


def _end_world(err: BaseException) -> None:
    """Under MPI, a rank that fails alone takes the job down instead of leaving the others waiting."""
    if "iobench.dist.world" in sys.modules:
        from .dist.world import abort_on_error

        abort_on_error(err)


if __name__ == "__main__":
    sys.exit(main())
