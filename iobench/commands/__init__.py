"""One module per `iobench` subcommand (see iobench.cli)."""
