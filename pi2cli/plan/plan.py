"""`pi2 plan`: choose the sparse engine's settings for one model, one device and one memory budget.

Inputs: the model's header and metadata (pi2cli.models.pi2file: dimensions, neuron type, predictors, and what
the generator or converter measured: predictor precision, sparsity, hot-set coverage), a hardware
profile (pi2cli.plan.profile: memory bandwidth, the storage curve, the cores) and the budget. Output: a plan
file, one flat JSON object whose settings are pi2-engine flags (`pi2-engine generate --plan FILE`), plus
the reasons for each choice ("why") and the predicted time per token, from the one predictor
(pi2cli.plan.predict, validated against this engine's runs). docs/PLAN.md has the rules and the format;
everything here is plain functions over plain data so the tests can drive them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli import __version__
from pi2cli.builds.capabilities import check_plan, engine_defaults, plan_keys
from pi2cli.errors import Pi2Error
from pi2cli.plan.facts import ModelFacts, engine_sizing, fixed_parts, predicted_fraction, round_up
from pi2cli.plan.predict import (
    curve_anomalies,
    default_ctx,
    device_from_probe,
    predict,
    predictor_bytes_in_file,
)
from pi2cli.plan.profile import (
    cluster_speed,
    default_compute_threads,
    read_json_file,
    validate_profile,
)
from pi2cli.units import format_size, parse_size

PLAN_FORMAT = "pi2-plan"
PLAN_VERSION = 1


@dataclass
class CacheSplit:
    cache_bytes: int
    preload: bool
    hot_fraction: float | None = None
    hot_share: float | None = None
    cluster: int | None = None
    hot_neurons: int = 0  # per block, as the engine will size it
    cold_slots: int = 0
    why: list[str] = field(default_factory=list)


def split_cache(m: ModelFacts, cache: int, engine_split) -> CacheSplit:
    """The hot/cold split for powerinfer2 (or the note that everything is preloaded). engine_split(
    hot_fraction, hot_share, cluster) -> (hot neurons per block, cold slots) as the engine sizes them."""
    F, nb = m.n_ff, m.n_blocks
    whole = nb * F * m.full_len
    if cache >= whole:
        return CacheSplit(cache, True, why=[
            f"cache {format_size(cache)} holds the whole FFN ({format_size(whole)}): everything preloaded with "
            f"large sequential reads at start, decode reads nothing; the hot/cold split does not matter"])  # fmt: skip
    cov = m.measured.get("hot_coverage")
    if cov is None or not 0 < cov < 1:
        d = engine_defaults()
        hot, cold = engine_split(d["hot_fraction"], d["hot_share"], d["cluster"])
        return CacheSplit(cache, False, d["hot_fraction"], d["hot_share"], d["cluster"], hot, cold, why=[
            f"no measured hot-set coverage in the model's metadata: engine defaults hot_fraction "
            f"{d['hot_fraction']}, hot_share {d['hot_share']}, cluster {d['cluster']}"])  # fmt: skip
    defaults = engine_defaults()
    hf = m.profiled_hot_fraction or defaults["hot_fraction"]
    hot_wanted = int(hf * F + 0.5)
    cluster = int(defaults["cluster"])
    why = []
    if hot_wanted < 4 * cluster:
        cluster = max(1, 2 ** int(math.log2(max(1, hot_wanted // 4))))
        why.append(f"cluster {cluster}: a block's hot set ({hot_wanted} neurons) should be at least 4 clusters, "
                   f"so it can shrink to what fits in small steps")  # fmt: skip
    else:
        kib = cluster * m.bundle_stride // 1024
        why.append(f"cluster {cluster} bundles ({kib} KiB per read): the engine's default; a block's hot set "
                   f"is {hot_wanted // cluster} clusters")  # fmt: skip
    hot_set = nb * round_up(hot_wanted, cluster) * m.bundle_stride
    pf = predicted_fraction(m)
    cold_floor = (
        int(2 * pf * F) * m.full_len
    )  # the predicted neurons of two blocks: no block split into waves
    hot_bytes = max(0, min(hot_set, cache - cold_floor))
    if hot_bytes >= hot_set and cache:
        # 3% headroom (the engine's own fixed region may come out a little larger than estimated): the
        # engine gives what the hot set does not use to the cold region, so rounding up costs nothing.
        share = min(1.0, math.ceil(min(cache - cold_floor, hot_set * 1.03) / cache * 100) / 100)
    else:
        share = math.floor(hot_bytes / cache * 100) / 100 if cache else 0.0
    p_hot = (1 - m.measured.get("sparsity", 0.9)) * cov / hf
    p_cold = (1 - m.measured.get("sparsity", 0.9)) * (1 - cov) / (1 - hf)
    why.append(f"hot set = the hottest {hf:.0%} of each block (they carry {cov:.0%} of activations, measured): "
               f"each is active ~{p_hot / max(p_cold, 1e-9):.0f}x as often as a cold neuron, so it is cached first")  # fmt: skip
    if hot_bytes >= hot_set:
        why.append(f"hot_share {share}: the whole hot set ({format_size(hot_set)}) fits; the other "
                   f"{format_size(cache - hot_set)} is the cold LRU region")  # fmt: skip
    else:
        why.append(f"hot_share {share}: the hot set ({format_size(hot_set)}) does not fit; the cold region keeps "
                   f"{format_size(cache - hot_bytes)} (at least the predicted neurons of 2 blocks, "
                   f"{format_size(cold_floor)}), the hot set shrinks to the rest")  # fmt: skip
    hot, cold = engine_split(hf, share, cluster)
    return CacheSplit(cache, False, round(hf, 4), share, cluster, hot, cold, why=why)


# ------------------------------------------------------------------------------------------- the cores
def choose_cores(profile: dict, threads: int | None) -> tuple[dict, list[str]]:
    """threads / affinity / io_threads / io_affinity from the profile's core clusters (docs/PLAN.md,
    "Cores"): compute on the big and mid cores, the I/O on one core, the little cores left out."""
    count = int(profile["cores"]["count"])
    clusters = [c for c in profile["cores"].get("clusters") or [] if c.get("cpus")]
    if threads is not None and threads < 1:
        raise Pi2Error(f"--threads must be at least 1, got {threads}")
    if threads is not None and threads > count:
        raise Pi2Error(f"--threads {threads}: the device has {count} cores")
    if len(clusters) <= 1:
        t = threads or count
        how = "one max frequency" if clusters else "no cpufreq information"
        return {"threads": t}, [f"threads {t}: the {count} cores are all alike ({how}): no pinning, the "
                                f"scheduler places compute and I/O threads"]  # fmt: skip
    ranked = sorted(clusters, key=cluster_speed, reverse=True)  # fastest first
    kind = {
        id(c): "big" if i == 0 else "little" if i == len(ranked) - 1 else "mid" for i, c in enumerate(ranked)
    }
    of = {cpu: c for c in ranked for cpu in c["cpus"]}
    order = [cpu for c in ranked for cpu in sorted(c["cpus"])]  # fastest first
    fast = [cpu for c in ranked[:-1] for cpu in sorted(c["cpus"])]  # the big and mid cores
    # One I/O core: the slowest big/mid core (the paper measured a mid core issuing reads within 6% of a
    # big one, a little core 29% slower); with a single big/mid core, the fastest little core.
    io_cpu = fast[-1] if len(fast) > 1 else order[len(fast)]
    t = threads or default_compute_threads(clusters)
    if t > len(order):  # cores without cpufreq (offline at profiling) have no place in the clusters
        raise Pi2Error(f"--threads {t}: the profile's clusters list {len(order)} CPUs to pin them to")
    compute = [cpu for cpu in order if cpu != io_cpu][:t] if t < len(order) else order

    def desc(cpus: list[int]) -> str:
        """'big 7 (3302 MHz, capacity 1024) + mid 2,3 (3148 MHz, capacity 870)': runs of one cluster."""
        runs: list[list[int]] = []
        for cpu in cpus:
            if runs and of[runs[-1][0]] is of[cpu]:
                runs[-1].append(cpu)
            else:
                runs.append([cpu])
        return " + ".join(f"{kind[id(of[r[0]])]} {','.join(map(str, r))} ({of[r[0]]['max_mhz']} MHz"
                          + (f", capacity {of[r[0]]['capacity']})" if of[r[0]].get("capacity") else ")")
                          for r in runs)  # fmt: skip

    layout = " + ".join(f"{len(c['cpus'])} {kind[id(c)]}" for c in ranked)
    out = {"threads": t, "affinity": ",".join(map(str, compute))}
    little = [cpu for cpu in compute if cpu not in fast]
    why = [f"threads {t} on {desc(compute)}: the cores are {layout}; compute goes on the big and mid cores, "
           f"fastest first, not on the little ones (a pool that splits a matrix evenly waits for its slowest "
           f"thread)" + (f"; --threads {t} puts compute on little cores too" if little else "")]  # fmt: skip
    if io_cpu in compute:
        why.append("every core computes: no core left for I/O, its threads are not pinned")
        return out, why
    # io_uring runs no threads of its own: one submitter. The pread pool: one thread per read in flight,
    # as many as the storage curve was measured with (pi2-probe gives pread one thread per queue slot).
    uring = str(profile["storage"].get("method", "")) == "io_uring"
    qd = int(profile["storage"]["curve"][0].get("qd") or 32)
    out["io_threads"] = 1 if uring else qd
    out["io_affinity"] = str(io_cpu)
    why.append(f"I/O on one core, {desc([io_cpu])}: one issuing core (the paper: UFS loses up to 40% when "
               f"several cores issue reads, and a little core issues 29% slower than a big one)"
               + ("; io_threads 1: io_uring needs one submitter (the engine today submits io_uring reads "
                  "from its compute threads and starts no I/O thread, so io_threads and io_affinity pin "
                  "only the pread pool)" if uring else
                  f"; io_threads {qd}: the pread pool's threads, one per read in flight, all on that core, "
                  f"as many as the storage curve was measured with (QD {qd})"))  # fmt: skip
    return out, why


# -------------------------------------------------------------------------------------------- the plan
@dataclass
class Plan:
    settings: dict  # the engine flags (plan keys)
    info: dict  # predicted_* / measured_* scalars
    why: list[str]
    model: str
    device: str

    def to_json(self) -> dict:
        out = {"format": PLAN_FORMAT, "version": PLAN_VERSION, "created_by": f"pi2 plan {__version__}",
               "model": self.model, "device": self.device}  # fmt: skip
        # in the engine's own key order (`pi2-engine capabilities`: plan.c's table, the one list of keys)
        out.update({k: self.settings[k] for k in plan_keys() if k in self.settings})
        out.update(self.info)
        out["why"] = "\n".join(self.why)
        return out


def make_plan(
    m: ModelFacts,
    profile: dict,
    budget: int,
    *,
    threads: int | None = None,
    ctx: int | None = None,
    pred_threshold: float | None = None,
    model_path: str = "",
) -> Plan:
    budget = parse_size(budget)  # the one range check every budget gets (pi2cli/units.py)
    ctx = default_ctx() if ctx is None else ctx
    if ctx < 1:
        raise Pi2Error(f"--ctx must be at least 1, got {ctx}")
    if pred_threshold is not None:
        if not 0 < pred_threshold < 1:
            raise Pi2Error(f"--pred-threshold must be a probability in (0, 1), got {pred_threshold}")
        if not m.has_predictor:
            raise Pi2Error("--pred-threshold needs a model with activation predictors")
    validate_profile(profile)
    curve = profile["storage"]["curve"]
    why: list[str] = []
    odd = curve_anomalies(curve)
    if odd:
        why.append(f"caution: the storage curve looks disturbed ({odd}); the disk was probably busy while "
                   f"profiling: profile again on an idle device")  # fmt: skip
    settings: dict = {}
    sparse = m.has_predictor
    settings["policy"] = "powerinfer2" if sparse else "dense"
    why.append("policy powerinfer2: the model has activation predictors" if sparse else
               "policy dense: the model has no activation predictors, so the sparse engine cannot choose "
               "neurons (convert or synthesize a model with predictors for powerinfer2)")  # fmt: skip
    settings["memory_budget"] = int(budget)
    cores, core_why = choose_cores(profile, threads)
    settings.update(cores)
    nthreads = cores["threads"]
    has_file = bool(model_path) and Path(model_path).is_file()
    if sparse and has_file:  # a file: the engine measures it, as bench asks
        from pi2cli.plan.min_budget import minimums_for_file, refusal

        answers = minimums_for_file(Path(model_path), ["powerinfer2"], ctx, nthreads, budget)
        line = refusal(budget, answers, m.name, ctx, nthreads)
        if line:
            raise Pi2Error(line)
    size = engine_sizing(m, budget, ctx, nthreads)
    if "error" in size:
        least = size.get("min_budget_bytes")
        raise Pi2Error(f"--memory-budget {format_size(budget)} is too small for {m.name}: the fixed region needs "
                       + (f"~{format_size(least)} at least" if least else "more")
                       + f" (pi2-engine size: {size['error']})")  # fmt: skip
    fixed = fixed_parts(size)
    raw = budget - fixed["total"]
    cache = int(size["cache"]["bytes"])
    why.append(f"budget {format_size(budget)} = fixed ~{format_size(fixed['total'])} (resident "
               f"{format_size(fixed['resident'])}, KV cache for --ctx {ctx} {format_size(fixed['kv_cache'])}, scratch "
               f"{format_size(fixed['scratch'])}, margin {format_size(fixed['margin'])}; pi2-engine size) + "
               + (f"neuron cache ~{format_size(cache)} (the engine measures the fixed region itself when it opens)"
                  if sparse else f"~{format_size(raw)} for the FFN pages the page cache keeps"))  # fmt: skip
    info: dict = {"predicted_fixed_bytes": int(fixed["total"]), "predicted_cache_bytes": int(cache),
                  "predicted_for_ctx": ctx}  # fmt: skip
    device = device_from_probe(profile, "pi2 profile", threads=nthreads)
    info["measured_membw_gb_per_s"] = round(device.membw_bytes_per_s / 1e9, 3)
    info["measured_io_method"] = str(profile["storage"].get("method", "?"))
    info["measured_iops_4k_qd32"] = next((round(p["iops"]) for p in curve if p["block"] == 4096), None)
    if sparse:
        dense_estimate = None

        def engine_split(hot_fraction, hot_share, cluster):
            c = engine_sizing(m, budget, ctx, nthreads, hot_fraction=hot_fraction, hot_share=hot_share,
                              cluster=cluster)["cache"]  # fmt: skip
            return c["hot_neurons_per_block"], c["cold_slots"]

        split = split_cache(m, cache, engine_split)
        if not split.preload:
            settings.update(hot_fraction=split.hot_fraction, hot_share=split.hot_share, cluster=split.cluster)
        chosen = {k: settings[k] for k in ("hot_fraction", "hot_share", "cluster") if k in settings}
        pred_bytes = predictor_bytes_in_file(model_path) if has_file else None

        def predicted(two_phase: bool | None) -> dict:
            return predict(m, device, budget, pred_bytes_per_block=pred_bytes, ctx=ctx, two_phase=two_phase,
                           split=chosen or None)  # fmt: skip

        us = lambda s: f"{s * 1e6:.1f} us"  # noqa: E731
        if not m.two_phase_applies:
            p = predicted(False)
            why.append(f"two_phase not set: it does not apply to this model ({m.ffn_act} activation, "
                       f"{m.neuron_type} neurons; it needs ReLU-family and Q4 bundles): cold bundles are read whole")  # fmt: skip
        else:
            # the choice the device model makes faster (the same per-read times it predicts with; a
            # calibration's line knows one kind of read only)
            whole, two = predicted(False), predicted(True)
            wins = two["model_tbt_ms"] < whole["model_tbt_ms"]
            p = two if wins else whole
            settings["two_phase"] = wins
            prec = float(m.measured.get("precision", 0.5))
            verdict = ("two-phase reads (gate part first) are cheaper: storage is bound by bandwidth here"
                       if wins else
                       "whole-bundle reads are cheaper: storage is bound by requests per second here")  # fmt: skip
            why.append(f"two_phase {str(wins).lower()}: a cold miss costs t({m.full_len} B) = "
                       f"{us(whole['whole_bundle_us'] / 1e6)} read whole vs t({m.gate_len} B) + precision {prec:.2f} "
                       f"x t({m.rest_len} B) = {us(two['two_phase_us'] / 1e6)} in two phases, at the queue depth a "
                       f"block's misses keep: {whole['model_tbt_ms']:.0f} against {two['model_tbt_ms']:.0f} ms a token; {verdict}"
                       + ("; moot while everything is preloaded" if split.preload else ""))  # fmt: skip
        why.extend(split.why)
        if not split.preload and m.arch != "moe":  # the engine looks ahead only where the next layer is known
            settings["lookahead"] = False
            why.append("lookahead false: reading what the next layer's predictor wants during attention "
                       "costs more reads than the overlap saves (7B shape, 2.68 GiB, 2-core VM, 4 alternated "
                       "pairs: 9.3k against 5.9k reads a token, 1.20-1.39x the time per token)")  # fmt: skip
        info["predicted_hot_neurons_per_block"] = int(p["hot_neurons_per_block"])
        info["predicted_hit_rate"] = p["hit_rate"]
        info["predicted_misses_per_token"] = p["misses_per_token"]
        info["predicted_reads_per_token"] = p["storage_reads_per_token"]
        info["predicted_whole_bundle_us"] = p["whole_bundle_us"]
        if m.two_phase_applies:
            info["predicted_two_phase_us"] = p["two_phase_us"]
        info["predicted_memory_ms"] = p["memory_ms"]
        info["predicted_storage_ms"] = p["storage_ms"]
        info["predicted_overlap_ms"] = p["overlap_ms"]
        info["predicted_model_tbt_ms"] = p["model_tbt_ms"]
        info["predicted_tbt_ms"] = p["tbt_ms"]
        info["predicted_tbt_source"] = p["tbt_source"]
        info["predicted_tok_s"] = p["tok_s"]
        info["predicted_named_source"] = p["named_source"]
        info["predicted_compute_source"] = p["compute_source"]
        model = (f"memory {p['memory_ms']:.0f} ms + storage {p['storage_ms']:.0f} ms ({p['misses_per_token']} cold "
                 f"misses, {p['storage_reads_per_token']} reads) - {p['overlap_ms']:.0f} ms overlapped (a block's "
                 f"reads fly while its cached neurons' gate and up rows are computed)")  # fmt: skip
        step = (f"from {p['tbt_source']} at {p['storage_reads_per_token']} reads (the device model: {model} = "
                f"{p['model_tbt_ms']:.0f} ms)" if p["tbt_fitted"] else f"= {model}")  # fmt: skip
        why.append(f"prediction: {p['tok_s']} tok/s, {p['tbt_ms']:.0f} ms a token {step}; hit rate {p['hit_rate']} "
                   f"({p['named_source']}); compute from {p['compute_source']}; pi2cli/plan/predict.py, "
                   f"docs/PLAN.md")  # fmt: skip
    else:
        # dense: the page cache keeps what the budget leaves of the FFN, the rest is paged in every token
        mem_bytes = m.per_token_resident_bytes + m.ffn_bytes
        paged = max(0, m.ffn_bytes - max(0, budget - fixed["total"]))
        best_bw = max(float(p["mb_per_s"]) for p in curve) * 1e6
        mem_s, io_s = mem_bytes / device.membw_bytes_per_s, paged / best_bw
        dense_estimate = mem_s + io_s
        info["predicted_memory_ms"] = round(mem_s * 1e3, 2)
        info["predicted_storage_ms"] = round(io_s * 1e3, 2)
        info["predicted_tbt_ms"] = round(dense_estimate * 1e3, 2)
        info["predicted_tok_s"] = round(1 / dense_estimate, 3) if dense_estimate > 0 else None
        why.append(f"estimate for dense: {dense_estimate * 1e3:.0f} ms a token = memory {mem_s * 1e3:.0f} ms "
                   f"({mem_bytes / 1e9:.2f} GB at {device.membw_bytes_per_s / 1e9:.1f} GB/s) + storage "
                   f"{io_s * 1e3:.0f} ms (~{format_size(paged)} of FFN weights paged a token at the best bandwidth "
                   f"measured, {best_bw / 1e6:.0f} MB/s: optimistic)")  # fmt: skip
    why.extend(core_why)
    if pred_threshold is not None:
        settings["pred_threshold"] = pred_threshold
        why.append(f"pred_threshold {pred_threshold}: given on the command line (overrides the model's per-layer "
                   f"thresholds)")  # fmt: skip
    info = {k: v for k, v in info.items() if v is not None}
    name = str((profile.get("target") or {}).get("name") or "?")
    if (profile.get("target") or {}).get("emulated"):
        why.append("the profile is from an emulated target: its timings are not the hardware's")
    return Plan(settings=settings, info=info, why=why, model=model_path or m.name, device=name)


# ------------------------------------------------------------------------------------------ plan files
def load_plan(path: str | Path) -> dict:
    """A plan file, checked by the engine alone (`pi2-engine size --plan FILE`: its parser and value
    rules, the ones `generate --plan` applies), then read. A plan the engine refuses is its one line."""
    check_plan(path)
    data = read_json_file(path, "plan")
    if not isinstance(data, dict):  # the engine reads only a flat object: unreachable, kept for the type
        raise Pi2Error(f"plan {path}: not a JSON object")
    return data
