"""Storage probes: block/file characterization, metadata rate, small files, object-store curves."""
