"""Cluster runs under MPI: the launch model (``world``) and world metrics (``aggregate``).

Every measuring command follows one model.  Started as ``mpirun -n N iobench …`` or
``srun iobench …``, each rank: resolves its config and proves that every rank resolved the
same one (``World.agree``); checks, all ranks together, that it can reach its inputs
(``World.all_ok``); waits at a barrier so the ranks start together; does its share (a
disjoint slice of shards, samples, files or objects); and sends its metrics to rank 0,
which writes ONE results file: ``per_rank`` detail and world metrics built by
``aggregate.merge`` — durations are the maximum over ranks, counts and bytes are summed,
rates are totals over the slowest rank's duration, latency histograms are merged (never
averaged percentiles), per-rank figures carry min/mean/max, and a straggler line names the
slowest rank.  Every collective wait is bounded (``World.timeout_s``); a rank that never
arrives ends the job with exit code 2 instead of a hang.
"""

from .world import World, detect_world

__all__ = ["World", "detect_world"]
