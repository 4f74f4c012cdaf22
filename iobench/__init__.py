"""iobench: storage and data-pipeline benchmarking for ML training."""

from ._version import __version__

# ``iobench.watch(loader)``: the data stall of your own training loop (see the iobench.watch module).
# Bound here after the module's import, so the name is the function, not the submodule.
from .watch import watch

__all__ = ["__version__", "watch"]
