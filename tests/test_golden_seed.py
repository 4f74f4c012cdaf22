"""Golden tests: the domain models' worked examples (tests/data/seed-examples.json) through the planner.

Each in-scope vector has an adapter that feeds its inputs (converted to SI) to the planner's
public functions and returns the outputs in SI.  Every output must match the formula's
exact value (``computed``) and, unless the vector is listed in FORMULA_OVER_TEXT, the
book's printed value within the vector's tolerance.  Where the book disagrees with its own
formula, the planner follows the formula; those vectors are named below.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from iobench.planner import checkpoint as ck
from iobench.planner import economics as ec
from iobench.planner import pipeline as pl
from iobench.planner import sharding as sh
from iobench.planner import staging as st
from iobench.planner import straggler as sg
from iobench.planner import tail as tl

VECTORS = {v["id"]: v for v in json.loads((Path(__file__).parent / "data" / "seed-examples.json").read_text())}

_F = {
    "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "PB": 1e15, "MiB": 2**20, "GiB": 2**30,
    "GiB/card": 2**30, "B params": 1e9,
    "B/s": 1, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12, "GB/s/core": 1e9,
    "s": 1, "ms": 1e-3, "µs": 1e-6, "µs/img": 1e-6, "min": 60, "h": 3600, "days": 86400,
    "%": 0.01, "pp": 0.01, "percentage points": 0.01, "% of μ": 0.01,
    "TB/day": 1e12, "GB/day": 1e9, "ms/s": 1e-3, "min/day": 60, "/day": 1 / 86400,
    "10^4 USD (萬美元)": 1e4, "萬": 1e4,
}


def si(value, unit):
    f = _F.get(unit, 1)  # counts, ratios, prices, "×" and friends are already in their unit
    if isinstance(value, list):
        return [si(v, unit) for v in value]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return value * f


class Inputs(dict):
    def __init__(self, vector):
        super().__init__({k: si(x["value"], x.get("unit")) for k, x in vector["inputs"].items()})


# ---- adapters: vector id -> function(inputs in SI) -> {expected name: value in SI} ------------

def g01(x):
    return {"BW_required": pl.required_bandwidth(x["N_GPU"], x["eta_target"], x["images_per_GPU"] * x["bytes_per_image"],
                                                 x["T_iteration"])}


def g02(x):
    return {"BW_required": pl.required_bandwidth(x["N_GPU"], x["eta_target"], x["tokens_per_GPU"] * x["bytes_per_token"],
                                                 x["T_iteration"])}


def g03(x):
    bw = pl.required_bandwidth(x["N_GPU"], 1.0, x["images_per_GPU"] * x["bytes_per_image"], x["T_iteration"])
    return {"BW_required": bw, "image_to_text_ratio": bw / x["BW_text"]}


def g04(x):
    s, p = pl.data_stall(x["T_compute"], x["T_IO"], False), pl.data_stall(x["T_compute"], x["T_IO"], True)
    return {"T_step_serial": s.step_s, "stall_serial": s.stall_ratio, "T_step_pipelined": p.step_s,
            "stall_pipelined": p.stall_ratio}


def g05(x):
    p = pl.prefetch_depth(x["T_IO_p99"], x["T_compute"], margin=2)
    return {"Q_prefetch_min": p.depth_min, "recommended_with_margin": p.depth_recommended,
            "dataloader_buffer": pl.torch_prefetch_batches(x["prefetch_factor"], x["num_workers"])}


def g06(x):
    b = x["batch_bytes_per_GPU"]
    return {"Q_min_NVMe": pl.prefetch_depth(x["P99_NVMe"], x["T_compute"]).depth_min,
            "Q_min_PFS": pl.prefetch_depth(x["P99_PFS"], x["T_compute"]).depth_min,
            "Q_min_object_store": pl.prefetch_depth(x["P99_object_store"], x["T_compute"]).depth_min,
            "buffer_per_GPU_depth5": pl.prefetch_buffer_bytes(x["safety_depth_object"], b),
            "buffer_per_node_depth5": pl.prefetch_buffer_bytes(x["safety_depth_object"], b, x["GPUs_per_node"]),
            "buffer_per_node_depth1": pl.prefetch_buffer_bytes(1, b, x["GPUs_per_node"])}


def g07(x):
    b = pl.decoded_batch_bytes(x["images_per_batch"], x["H"], x["W"], x["C"])
    buf = pl.prefetch_buffer_bytes(x["depth"], b)
    return {"decoded_batch": b, "decoded_batch_decimal": b, "prefetch_buffer_8": buf, "prefetch_buffer_8_decimal": buf}


def g08(x):
    return {"text_shuffle_buffer": pl.shuffle_buffer_bytes(x["entries"], x["tokens_per_sequence"] * x["bytes_per_token"]),
            "image_shuffle_buffer": pl.shuffle_buffer_bytes(x["entries"], x["bytes_per_decoded_image"])}


def g09(x):
    rate = x["img_per_s_per_GPU"] * x["GPUs_per_node"]
    lo, hi = x["t_decode_per_image"]
    low = pl.loader_cpu(rate, lo, x["G"], 4, x["CPU_cores"])
    return {"node_image_rate": rate, "shortfall_low": low.cpu_s_per_s,
            "shortfall_high": pl.loader_cpu(rate, hi).cpu_s_per_s, "W_workers": low.workers,
            "spare_cores": low.spare_cores}


def g10(x):
    c = sh.shard_collision(x["n_workers"], x["k_shards"])
    return {"P_no_collision": 1 - c.p_collision, "P_collision": c.p_collision,
            "P_collision_exact_product": c.p_collision_exact}


def g11(x):
    t = tl.tail_amplification(x["p_slow"], x["N_servers"])
    return {"P_all_fast": t.p_all_fast, "P_at_least_one_slow": t.p_step_slow}


def g12(x):
    h = tl.hedged(x["p_slow"], x["N_servers"], x["replicas"])
    return {"P_both_slow": h.p_request_slow, "P_step_slow_hedged": h.p_step_slow}


def g13(x):
    g = pl.local_cache_gain(x["T_compute"], x["T_IO_remote"], x["T_IO_local"], x["N_GPU"])
    return {"eta_remote": g.utilization_remote, "eta_local": g.utilization_local, "gain_pp": g.gain,
            "equivalent_GPUs": g.equivalent_accelerators}


def g14(x):
    m = sh.metadata_reduction(x["tokens"], total_bytes=x["corpus_bytes"], container_bytes=x["shard_bytes"])
    return {"shards": m.containers, "reduction": m.reduction}


def g15(x):
    m = sh.metadata_reduction(x["images"], x["tars"])
    return {"images_per_tar": m.items_per_container, "reduction_factor": m.reduction,
            "orders_of_magnitude": m.orders_of_magnitude}


def g16(x):
    m = sh.metadata_reduction(x["samples_per_tar"], total_bytes=x["tar_bytes"], container_bytes=x["tar_bytes"])
    return {"implied_mean_sample_size": x["tar_bytes"] / m.items_per_container, "metadata_reduction": m.reduction}


def g17(x):
    lo, hi = x["open_overhead"]
    return {"cpu_ms_per_s_low": sh.open_overhead_cpu(lo, x["files_per_second"]),
            "cpu_ms_per_s_high": sh.open_overhead_cpu(hi, x["files_per_second"])}


def g18(x):
    c = pl.iops_cap(x["images_per_s"], x["bytes_per_image"], x["HDD_random_IOPS"])
    return {"raw_bandwidth": c.bandwidth_bytes_per_s, "IOPS_shortfall": c.iops_shortfall,
            "utilization_cap": c.utilization_cap}


def g19(x):
    a = pl.decompression_cpu(x["raw_BW"], x["ratio_zstd1"], x["decomp_per_core_zstd1"])
    b = pl.decompression_cpu(x["raw_BW"], x["ratio_zstd9"], x["decomp_per_core_zstd9"])
    return {"effective_BW_zstd1": a.effective_bytes_per_s, "effective_BW_zstd9": b.effective_bytes_per_s,
            "cores_zstd1": a.cores, "cores_zstd9": b.cores, "core_ratio_zstd9_vs_zstd1": b.cores / a.cores}


def g20(x):
    return {"RAID0_BW": x["drives"] * x["per_drive_BW"],
            "T_stream": st.stream_time(x["dataset"], x["drives"], x["per_drive_BW"])}


def g21(x):
    c = st.local_capacity(x["drives"], x["drive_capacity"], x["multimodal_dataset"])
    return {"local_capacity": c.local_bytes, "dataset_total": x["multimodal_dataset"], "overflow": c.overflow_bytes}


def g22(x):
    e = ck.ssd_endurance(x["capacity"], x["DWPD"], x["warranty_years"], x["shard_per_checkpoint"], x["interval"])
    return {"daily_write_budget": e.daily_budget_bytes, "lifetime_writes": e.lifetime_bytes,
            "checkpoint_writes_per_day": e.checkpoint_bytes_per_day, "fraction_of_1DWPD": e.fraction_of_budget}


def g24(x):
    return {"T_drain": st.cold_start(x["HBM_capacity"], x["HBM_BW"]).load_s,
            "T_backfill": st.cold_start(x["HBM_capacity"], x["DRAM_BW"]).load_s}


def g29(x):
    n = x["params"]
    bpp = ck.bytes_per_param(weights=x["bytes_weights"], master=0, optimizer=x["bytes_adam"])
    return {"weights": ck.checkpoint_size(n, x["bytes_weights"]), "optimizer": ck.checkpoint_size(n, x["bytes_adam"]),
            "checkpoint": ck.checkpoint_size(n, bpp), "bytes_per_param": bpp}


def g30(x):
    r = ck.retention(x["run_days"], x["interval"], x["ckpt"], x["keep_last"], x["archive_every_nth"],
                     x["compressed_source"] + x["tokenized_corpus"], x["epoch_read"])
    return {"N_checkpoints": r.checkpoints, "total_written": r.total_written_bytes, "PFS_footprint": r.footprint_bytes,
            "archived_snapshots": r.archived, "archive_total": r.archive_bytes,
            "ckpt_to_data_ratio": r.written_to_data_ratio}


def g31(x):
    state = ck.bytes_per_param(weights=x["weights_FP16"], master=0, optimizer=x["optimizer"], grads=x["grads_FP16"])
    s = ck.checkpoint_storm(state, x["R_replicas"], x["BW_fabric"], sharded=False)
    return {"per_replica_state": state, "total_write": s.total_bytes, "T_write": s.write_s, "T_write_min": s.write_s}


def g32(x):
    s = ck.checkpoint_storm(x["per_replica_state"], x["R_replicas"], x["BW_fabric"], sharded=True)
    return {"total_write": s.total_bytes, "per_replica_shard": s.bytes_per_replica, "T_write": s.write_s}


def g33(x):
    s = ck.staged_checkpoint(x["ckpt"], x["nodes"], x["local_BW"], x["PFS_BW"], x["interval"])
    one = ck.staged_checkpoint(x["ckpt"], x["nodes"], x["single_NVMe_BW"], x["PFS_BW"], x["interval"])
    return {"shard_per_node": s.shard_bytes, "T_local_write": s.local_write_s, "PFS_total_unrounded": s.pfs_total_bytes,
            "T_PFS_storm": s.pfs_drain_s, "per_node_PFS_BW": s.pfs_bytes_per_s_per_node,
            "pause_overhead": s.pause_overhead, "T_single_NVMe": one.local_write_s}


def g34(x):
    return {"burst": ck.checkpoint_storm(x["per_node_shard"], x["nodes"], 1.0, sharded=False).total_bytes,
            "implied_shard": ck.staged_checkpoint(x["ckpt"], x["nodes"], 1.0, 1.0, 1.0).shard_bytes}


def g35(x):
    return {"iterations_per_checkpoint_pause": ck.pause_steps(x["T_write"], x["T_iteration"])}


def g36(x):
    a = st.staging_time(x["dataset"], x["nodes"], x["rate_uncontended"])
    b = st.staging_time(x["dataset"], x["nodes"], x["rate_contended"])
    return {"per_node_data": a.bytes_per_node, "T_stage_uncontended": a.stage_s, "T_stage_contended": b.stage_s}


def g37(x):
    s = st.staging_time(x["dataset"], x["nodes"], x["per_node_rate"])
    return {"per_node_data": s.bytes_per_node, "T_prestage": s.stage_s}


def g38(x):
    m = x["model_bytes"]
    striped = st.cold_start(m, x["per_drive_BW"], x["drives"])
    return {"T_single_NVMe": st.cold_start(m, x["NVMe_single"]).load_s, "T_PFS": st.cold_start(m, x["PFS_per_node"]).load_s,
            "T_object_store": st.cold_start(m, x["object_store"]).load_s, "shard_per_drive": striped.bytes_per_drive,
            "T_striped": striped.load_s}


def g39(x):
    return {"fan_out": st.fan_out_bytes(x["replicas"], x["model_bytes"])}


def g50(x):
    d = x["dataset"]
    return {"object_per_year": ec.storage_cost(d, x["object_price"]), "NVMe_per_year": ec.storage_cost(d, x["NVMe_price"]),
            "archive_per_year": ec.storage_cost(d, x["archive_price"]),
            "archive_two_years": ec.storage_cost(d, x["archive_price"], x["archive_months"]),
            "HBM_equivalent": ec.per_gb_cost(d, x["HBM_price"])}


def g51(x):
    d = x["dataset"]
    return {"egress_one_read": ec.egress_cost(d, x["egress_price"]),
            "egress_10_reads": ec.egress_cost(d, x["egress_price"], x["reads"]),
            "annual_storage_s3_standard": ec.storage_cost(d, x["s3_standard_price"])}


def g52(x):
    return {"GET_cost": ec.request_cost(x["files"], x["GET_price"]),
            "storage_per_month": ec.storage_cost(x["dataset_for_storage_line"], x["s3_standard_price"], 1)}


def g53(x):
    r, e = ec.per_gb_cost(x["dataset"], x["retrieval_price"]), ec.egress_cost(x["dataset"], x["egress_price"])
    return {"retrieval_fee": r, "egress_fee": e, "total": r + e}


def g54(x):
    n, p = x["GPUs"], x["price"]
    drop = x["util_before"] - x["util_after"]
    return {"daily_spend": ec.idle_cost(n, p, 86400), "daily_loss": ec.idle_cost(n, p, 86400, drop),
            "loss_30_days": ec.idle_cost(n, p, x["days"], drop)}


def g55(x):
    return {"waste": ec.idle_cost(x["GPUs"], x["price"], x["hours"], x["stall_increase"])}


def g56(x):
    s = ec.stream_vs_stage(x["dataset"], x["epochs"], x["runs_per_year"], x["s3_price"], 0.0, x["egress_price"])
    return {"storage_per_year": s.object_usd_per_year, "egress_per_run": s.egress_per_run_streaming,
            "annual_total": s.stream_usd_per_year}


def g57(x):
    # Option A of G56: 20 epochs per run, S3 Standard at $0.023/GB/month.
    s = ec.stream_vs_stage(x["dataset"], 20, x["runs_per_year"], 0.023, x["NVMe_price"], x["egress_price"])
    assert s.stream_usd_per_year == pytest.approx(x["option_A_total"])
    return {"NVMe_per_year": s.nvme_usd_per_year, "staging_egress_per_year": s.staging_egress_usd_per_year,
            "annual_total": s.stage_usd_per_year, "annual_savings": s.savings_usd_per_year}


def g58(x):
    nvme_price = x["NVMe_per_year"] / ec.storage_cost(x["dataset"], 1.0)
    s = ec.stream_vs_stage(x["dataset"], 1, x["runs_per_year"], 0.023, nvme_price, x["egress_price"])
    assert s.staging_egress_usd_per_year == pytest.approx(x["staging_egress_per_year"])
    return {"break_even_epochs": s.break_even_epochs, "first_cheaper_integer_epoch": s.first_cheaper_epoch}


def g59(x):
    lo, hi = x["capex"]
    a = ec.build_vs_buy(x["data"], x["object_price"], x["reads_per_year"], x["egress_price"], x["onprem_opex"], lo)
    b = ec.build_vs_buy(x["data"], x["object_price"], x["reads_per_year"], x["egress_price"], x["onprem_opex"], hi)
    return {"cloud_storage": ec.storage_cost(x["data"], x["object_price"]),
            "cloud_egress": ec.egress_cost(x["data"], x["egress_price"], x["reads_per_year"]),
            "cloud_total": a.cloud_usd_per_year, "net_savings": a.net_savings_usd_per_year,
            "payback_low": a.payback_years, "payback_high": b.payback_years}


def g64(x):
    b = pl.run_budget(x["D_tokens"], x["seqs_per_step"], x["seq_len"], x["T_train"])
    return {"tokens_per_step": b.tokens_per_step, "iterations": b.iterations, "step_budget": b.step_budget_s,
            "rate_30d": pl.run_budget(x["D_tokens"], x["seqs_per_step"], x["seq_len"], x["T_total"]).tokens_per_s,
            "rate_25d": b.tokens_per_s}


def g65(x):
    t = pl.token_loader(x["token_rate"], x["seq_len"], x["bytes_per_id"], x["per_worker_rate"])
    return {"seq_rate": t.sequences_per_s, "wire_rate": t.wire_bytes_per_s, "workers_min": t.workers_min}


def g67(x):
    return {"avg_write_rate": ck.average_write_rate(x["ckpt_bytes"], x["interval"])}


def g68(x):
    n = x["N"]
    bpp = ck.bytes_per_param(x["bytes_weights"], x["bytes_master"], x["bytes_m"] + x["bytes_v"], x["bytes_grads"])
    size = ck.checkpoint_size(n, bpp)
    return {"bytes_per_param": bpp, "weights_BF16": ck.checkpoint_size(n, x["bytes_weights"]),
            "FP32_state_each": ck.checkpoint_size(n, 4), "M_persistent_GB": size, "M_persistent_GiB": size,
            "bytes_per_param_fp32_grads": ck.bytes_per_param(x["bytes_weights"], x["bytes_master"],
                                                             x["bytes_m"] + x["bytes_v"], 4)}


def g69(x):
    bpp = ck.bytes_per_param(x["bytes_weights"], x["bytes_master"], x["bytes_adam"])
    size = ck.checkpoint_size(x["N"], bpp)
    return {"bytes_per_param": bpp, "ckpt_GB": size, "ckpt_bytes_exact": size}


def g72(x):
    a = ck.async_backlog(x["S"], x["BW_good"], x["interval_a"])
    b = ck.async_backlog(x["S"], x["BW_good"], x["interval_b"])
    return {"T_write_7": a.write_s, "T_write_20": ck.async_backlog(x["S"], x["BW_better"], 1).write_s,
            "demand_10s": a.demand_bytes_per_s, "demand_20s": b.demand_bytes_per_s,
            "backlog_7GBps_10s": a.backlog, "backlog_7GBps_20s": b.backlog}


def g73(x):
    slow = ck.commit_timeline(x["S"], x["BW"][0], x["snap_times"], x["copy_to_buffer"], x["t_fail"])
    fast = ck.commit_timeline(x["S"], x["BW"][1], x["snap_times"], x["copy_to_buffer"], x["t_fail"])
    return {"commits_7GBps_1": slow.commits_s[0], "commits_7GBps_2": slow.commits_s[1],
            "commits_20GBps_1": fast.commits_s[0], "commits_20GBps_2": fast.commits_s[1],
            "redo_7GBps": slow.redo_s, "redo_20GBps": fast.redo_s, "redo_saved": slow.redo_s - fast.redo_s,
            "foreground_pause_total": slow.foreground_pause_s}


def g74(x):
    c = ck.write_time(x["S"], x["BW"])
    tau = ck.optimal_interval(c, ck.failure_rate(job_mtbf_s=x["MTBF_job"]))
    return {"c": c, "c_footnote": c, "tau_star": tau, "tau_star_footnote": tau, "tau_star_min": tau,
            "per_card_MTBF": ck.per_accelerator_mtbf(x["MTBF_job"], x["cards"])}


def g75(x):
    out = {}
    for o in ck.overhead_table(x["c"], x["lambda"], x["r"], x["tau"]):
        t = int(o.interval_s)
        out.update({f"save_{t}": o.save, f"redo_{t}": o.redo, f"recover_{t}": o.recover, f"total_{t}": o.total})
    return out


def g76(x):
    return {"tau_star_poisson": ck.poisson_optimal_interval(x["c"], x["lambda"])}


def g77(x):
    ratio = ck.optimal_interval(1.0, x["factor"]) / ck.optimal_interval(1.0, 1.0)
    return {"ratio": ratio, "tau_star_2x_cards": x["tau_star_base"] * ratio}


def g78(x):
    a, b = (ck.checkpoint_overhead(x["c"], ck.failure_rate(per_accelerator_mtbf_s=x["per_card_MTBF"], accelerators=n),
                                   x["r"], x["tau"]).total for n in x["cards"])
    return {"L_32": a, "L_48": b, "difference": b - a}


def g79(x):
    hw, both = x["lambda_hw"], x["lambda_hw"] + x["lambda_spike"]
    L = lambda lam, tau: ck.checkpoint_overhead(x["c"], lam, x["r"], tau).total  # noqa: E731
    return {"L600_hw": L(hw, x["tau_a"]), "L600_hw_spike": L(both, x["tau_a"]),
            "tau_star_hw": ck.optimal_interval(x["c"], hw), "tau_star_hw_spike": ck.optimal_interval(x["c"], both),
            "L1800_hw": L(hw, x["tau_b"]), "L1800_hw_spike": L(both, x["tau_b"]),
            "delta_days": x["base_days"] * (L(both, x["tau_b"]) - L(hw, x["tau_b"]))}


def g80(x):
    out = {}
    mu, ov = x["mu"], x["overhead"]
    for n in x["N"]:
        lo, hi = (sg.straggler_step(mu, p * mu, n, ov) for p in x["sigma_pct"])
        out.update({f"Emax_sigma_{n}": lo.expected_max_sigmas, f"step_2pct_{n}": lo.step_s, f"step_5pct_{n}": hi.step_s})
        if n in (48, 1024):
            out[f"extra_{n}_5pct"] = hi.extra_s
    out["step_no_jitter"] = sg.straggler_step(mu, 0.0, 8, ov).step_s
    return out


def g81(x):
    r = {n: sg.straggler_responses(x["mu"], x["sigma"], n, x["overhead"], x["tau"], x["r"], x["step_48"])
         for n in (8, 48, 1024)}
    return {"extra_wait_8_sigma": r[8].wait_extra_sigmas, "extra_wait_8": r[8].wait_extra_s,
            "extra_wait_48_sigma": r[48].wait_extra_sigmas, "extra_wait_48": r[48].wait_extra_s,
            "extra_wait_1024": r[1024].wait_extra_s, "redistribute_48": r[48].redistribute_step_s,
            "redistribute_8": r[8].redistribute_step_s, "evict_cost": r[48].evict_cost_s,
            "evict_steps": r[48].evict_cost_steps}


def g82(x):
    rate = x["rate_pro"]
    g5, g6, g8 = x["gaps_h"]
    return {"cost_interruptions_pro": ec.idle_cost(1, rate, x["interrupt_hours_pro"]),
            "gap5_cost": ec.idle_cost(1, rate, g5), "gap6_cost": ec.idle_cost(1, rate, g6),
            "gap8_cost": ec.idle_cost(1, rate, g8)}


def g83(x):
    out = {}
    for t, L, n in zip(x["t_s"], x["L"], (32, 48)):
        c = ck.completion_time(x["iterations"], t, L, start_s=x["T0"])
        out.update({f"base_{n}": c.base_s, f"finish_{n}": c.finish_s})
    return out


def g84(x):
    return {"t_s_max": ck.step_budget(x["T_train"], x["iterations"], x["L"])}


def g88(x):
    n = x["N"]
    out = {f"M{s}": ck.zero_rank_bytes(n, x["d"], s) for s in (0, 1, 2)}
    out["M3_d8"] = ck.zero_rank_bytes(n, x["d"], 3)
    for d in x["d_alt"]:
        out[f"M3_d{d}"] = ck.zero_rank_bytes(n, d, 3)
    return out


ADAPTERS = {name.upper(): fn for name, fn in dict(globals()).items()
            if callable(fn) and name[0] == "g" and name[1:].isdigit()}

# Vectors the planner does not model, and why.
OUT_OF_SCOPE = {
    "G23": "hardware bandwidth ratios quoted from spec sheets", "G25": "cluster bandwidth quoted from spec sheets",
    "G26": "historical hardware growth", "G27": "device random-vs-sequential ratio (iobench probe measures it)",
    "G28": "dataset sizing arithmetic (iobench gen sizes datasets itself)",
    "G40": "GDS CPU cost (iobench gds measures it)", "G41": "PFS architecture", "G42": "PFS striping",
    "G43": "PFS load balance", "G44": "PFS sharing between jobs", "G45": "erasure-coding overhead",
    "G46": "object-store request fan-in", "G47": "host DRAM budget", "G48": "HBM capacity",
    "G49": "HBM budget", "G60": "tiering economics (price not stated)", "G61": "dataset versioning",
    "G62": "synthetic-data footprint", "G63": "vector-index sizing",
    "G66": "loader resume position (the checkpoint engine stores it)",
    "G70": "TP resharding (the checkpoint engine's restore does it)", "G71": "sequence-packer state",
    "G85": "pipeline-parallel bubble", "G86": "pipeline schedules", "G87": "pipeline schedules",
    "G89": "low-precision operand copies", "G90": "activation recompute", "G91": "host-device offload",
    "G92": "routing-replay records", "G93": "weight distribution fan-out in RL", "G94": "activation sizes",
}

# Expected items of in-scope vectors that are bookkeeping around the model, not an output of it.
NOT_MODELLED = {
    ("G33", "PFS_total"): "the book multiplies the rounded 6.8 GB shard; the planner's total is PFS_total_unrounded",
    ("G36", "daily_idle_saved"): "failures/day × minutes saved, no model",
    ("G50", "HBM_over_object_price"): "ratio of quoted prices", ("G50", "NVMe_over_object"): "ratio of quoted prices",
    ("G50", "object_over_archive"): "ratio of quoted prices", ("G50", "HBM_over_archive_price"): "ratio of quoted prices",
    ("G65", "two_workers"): "worker count × rate", ("G65", "three_workers"): "worker count × rate",
    ("G65", "four_workers"): "worker count × rate", ("G65", "demand_48"): "sequences / step time",
    ("G65", "step_48_with_wait"): "sum of two inputs", ("G65", "step_32_with_wait"): "sum of two inputs",
    ("G67", "avg_write_rate_exact_bytes"): "uses G69's byte count, not this vector's input",
    ("G80", "share_of_margin"): "ratio to G84's margin", ("G82", "total_runtime_pro"): "hours / share",
    ("G82", "half_hours"): "what-if halving", ("G82", "half_savings"): "what-if halving",
    ("G83", "slack_48"): "the 30-day deadline is not among the inputs", ("G84", "margin"): "bound − input",
    ("G88", "RTX4090_GiB"): "unit conversion", ("G88", "total_d8"): "+ reserve", ("G88", "overflow_d8"): "budget − total",
    ("G88", "total_d16"): "+ reserve", ("G88", "total_d32"): "+ reserve", ("G88", "total_d48"): "+ reserve",
    ("G88", "margin_d32"): "budget − total", ("G88", "margin_d48"): "budget − total",
}

# Where the printed number disagrees with the book's own formula, the planner follows the formula.
FORMULA_OVER_TEXT = {
    "G07": "decoded batch labelled '37 MB' is 36.75 MiB; the planner gives bytes (38,535,168)",
    "G09": "lower decode shortfall printed 10×; 8,000 img/s × 1 ms = 8×",
    "G15": "200M/50k = 4,000× = 10^3.6, printed as 'four orders of magnitude'",
    "G19": "printed '3× the cores'; 224 vs 56 cores at the stated throughputs is 4×",
    "G24": "HBM drain printed 50 ms; 80 GB / 3.35 TB/s = 23.9 ms",
    "G30": "intro says ~1,000×; 7,560 TB / 6 TB = 1,260×",
    "G33": "PFS total printed 1.8 TB from a rounded shard; unrounded 1.75 TB",
    "G82": "costs printed with an unrounded dashboard rate; the printed $20,600/h gives 62.0 / 5.69 / 5.42 / 6.08",
}


def _printed_only(vid):
    """Items where the book's printed figure (recorded beside the formula's) is not what the planner gives."""
    return [t for t in VECTORS[vid]["text_value_if_different"] or []]


def _close(ours, target, abs_tol=None, rel=1e-5):
    if isinstance(target, bool) or isinstance(ours, bool):
        return bool(ours) == bool(target)
    if abs_tol is not None:
        return abs(ours - target) <= abs_tol * (1 + 1e-9) + 1e-12
    return math.isclose(ours, target, rel_tol=rel, abs_tol=1e-12)


def test_every_vector_is_classified():
    scoped = set(ADAPTERS) | set(OUT_OF_SCOPE)
    assert scoped == set(VECTORS), sorted(set(VECTORS) ^ scoped)
    assert not set(ADAPTERS) & set(OUT_OF_SCOPE)
    assert len(ADAPTERS) >= 60


@pytest.mark.parametrize("vid", sorted(ADAPTERS))
def test_vector(vid):
    v = VECTORS[vid]
    got = ADAPTERS[vid](Inputs(v))
    names = {e["name"] for e in v["expected"]}
    missing = {n for n in names if n not in got and (vid, n) not in NOT_MODELLED}
    assert not missing, f"{vid}: adapter does not produce {sorted(missing)}"
    assert not set(got) - names, f"{vid}: unknown outputs {sorted(set(got) - names)}"
    off_text = []
    for e in v["expected"]:
        if e["name"] not in got:
            continue
        ours = got[e["name"]]
        factor = si(1.0, e["unit"])
        # The formula's exact value, always.
        assert _close(ours, si(e["computed"], e["unit"])), (vid, e["name"], ours / factor, e["computed"])
        # The book's printed value within its tolerance, unless the book disagrees with its formula.
        tol = e.get("abs_tol")
        if not _close(ours, si(e["value"], e["unit"]), None if tol is None else tol * factor):
            off_text.append(e["name"])
    for t in _printed_only(vid):
        if t["name"] in got and t.get("text_numeric") is not None:
            e = next(e for e in v["expected"] if e["name"] == t["name"])
            factor = si(1.0, e["unit"])
            assert not _close(got[t["name"]], si(t["text_numeric"], e["unit"]), 1e-9 * factor), (vid, t["name"])
            off_text.append(t["name"])
    if vid in FORMULA_OVER_TEXT:
        assert off_text or _printed_only(vid), f"{vid} is listed as formula-over-text but matches the printed value"
    else:
        assert not off_text, f"{vid}: {off_text} differ from the printed value beyond its tolerance"


def test_formula_over_text_vectors_are_the_recorded_disagreements():
    recorded = {vid for vid, v in VECTORS.items() if v["text_value_if_different"] and vid in ADAPTERS}
    assert set(FORMULA_OVER_TEXT) == recorded


def test_out_of_scope_items_exist():
    for vid, name in NOT_MODELLED:
        assert name in {e["name"] for e in VECTORS[vid]["expected"]}, (vid, name)
