"""MLPerf Storage: its training workloads, its rules and its headline question -- how many
simulated accelerators per node this storage keeps at AU >= the workload's threshold.

``workloads`` (the named workloads and accelerator step times), ``rules`` (dataset size,
compliance), ``run`` (simulated accelerators: one consumer process per accelerator, each
with its own loader workers), ``findmax`` (the search), ``checkpoint`` (llama3 presets
through ``iobench ckpt``), ``scale`` (measured points -> prediction at 8..4096 nodes).
"""
