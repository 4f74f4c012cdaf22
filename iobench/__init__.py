"""iobench: storage and data-pipeline benchmarking for ML training."""

__version__ = "0.1.0"
