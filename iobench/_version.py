"""The version, in a leaf module: modules that record it import it from here, not from the package,
whose ``__init__`` imports ``iobench.watch`` (a cycle otherwise)."""

__version__ = "0.1.0"
