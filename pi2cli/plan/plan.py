"""`pi2 plan`: choose the sparse engine's settings for one model, one device and one memory budget.

Inputs: the model's header and metadata (pi2cli.models.pi2file: dimensions, neuron type, predictors, and what
the generator or converter measured: predictor precision, sparsity, hot-set coverage), a hardware
profile (pi2cli.plan.profile: memory bandwidth, the storage curve, the cores) and the budget. Output: a plan
file, one flat JSON object whose settings are pi2-engine flags (`pi2-engine generate --plan FILE`), plus
the reasons for each choice ("why") and an estimate of the time per token. docs/PLAN.md has the rules
and the format; everything here is plain functions over plain data so the tests can drive them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli import __version__
from pi2cli.builds.capabilities import engine_size, plan_keys
from pi2cli.errors import Pi2Error
from pi2cli.plan.profile import check_format, read_json_file
from pi2cli.units import format_size, parse_size

PLAN_FORMAT = "pi2-plan"
PLAN_VERSION = 1
MiB = 1 << 20
DIRECT_ALIGN = 512  # the smallest O_DIRECT unit: the engine rounds its reads to it
DEFAULT_CTX = 4096  # pi2-engine chat's default context (and pi2 bench's)
ENGINE_DEFAULTS = {"hot_fraction": 0.2, "hot_share": 0.5, "cluster": 32}
IO_METHODS = ("auto", "uring", "pread", "buffered")


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


# ---------------------------------------------------------------------------------------------- model
@dataclass
class ModelFacts:
    """What the planner needs from a .pi2 file (model_facts() reads them)."""

    name: str
    arch: str
    ffn_act: str
    neuron_type: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    has_predictor: bool
    part_bytes: int  # one gate row / up row / down column of a bundle
    bundle_stride: int  # a bundle in the file, with its alignment padding
    resident_bytes: int  # the resident region (attention, norms, embeddings, predictors, output)
    per_token_resident_bytes: int  # resident bytes one decode step reads (one embedding row)
    other_bytes: int = 0  # tensor table, tokenizer, metadata
    n_expert: int = 0
    n_expert_used: int = 0
    dense_down: bool = False
    measured: dict = field(
        default_factory=dict
    )  # precision, recall, sparsity, hot_coverage, predicted_fraction
    profiled_hot_fraction: float | None = None  # the hot set that hot_coverage was measured for
    synthetic: bool = False

    @property
    def n_blocks(self) -> int:
        return self.n_layer * (self.n_expert if self.arch == "moe" else 1)

    @property
    def blocks_per_token(self) -> int:
        return self.n_layer * (self.n_expert_used if self.arch == "moe" else 1)

    @property
    def full_len(self) -> int:
        """A whole-bundle read (and a cold cache slot): the bundle without padding, 512-rounded."""
        return round_up(3 * self.part_bytes, DIRECT_ALIGN)

    @property
    def gate_len(self) -> int:
        return round_up(self.part_bytes, DIRECT_ALIGN)

    @property
    def rest_len(self) -> int:
        """Two-phase's second read: from the gate's last 512-byte unit to the end of the down column."""
        return self.full_len - self.part_bytes // DIRECT_ALIGN * DIRECT_ALIGN

    @property
    def ffn_bytes(self) -> int:
        """The FFN's weights without padding (the bytes a dense forward reads)."""
        return 3 * self.part_bytes * self.n_ff * self.n_blocks

    @property
    def two_phase_applies(self) -> bool:
        return self.ffn_act != "swiglu" and self.neuron_type in ("Q4_0", "Q4_1")


def model_facts(path: str | Path) -> ModelFacts:
    from pi2cli.models.pi2file import SEC_RESIDENT, Pi2File, Pi2FormatError

    path = Path(path)
    if not path.is_file():
        raise Pi2Error(f"--model {path}: no such file")
    try:
        f = Pi2File(path, verify=False)
    except (Pi2FormatError, OSError, ValueError) as exc:
        raise Pi2Error(f"--model {path}: {exc}") from None
    h = f.header
    resident = f.sections[SEC_RESIDENT][1]
    embd = f.tensors.get("token_embd.weight")
    per_token = resident - (embd.nbytes - embd.nbytes // max(1, embd.n_rows) if embd else 0)
    meta = f.metadata if isinstance(f.metadata, dict) else {}
    measured = meta.get("measured") if isinstance(meta.get("measured"), dict) else {}
    profile = meta.get("activation_profile") if isinstance(meta.get("activation_profile"), dict) else {}
    hot = profile.get("hot_fraction")
    name = path.parent.name if path.stem == "model" and path.parent.name else path.stem
    return ModelFacts(
        name=name, arch=h.arch, ffn_act=h.ffn_act, neuron_type=h.neuron_type, n_layer=h.n_layer,
        n_embd=h.n_embd, n_ff=h.n_ff, n_head=h.n_head, n_head_kv=h.n_head_kv, head_dim=h.head_dim,
        n_vocab=h.n_vocab, has_predictor=h.has_predictor, part_bytes=h.part_bytes,
        bundle_stride=h.bundle_stride, resident_bytes=resident, per_token_resident_bytes=per_token,
        other_bytes=sum(s[1] for i, s in enumerate(f.sections) if i > SEC_RESIDENT),
        n_expert=h.n_expert, n_expert_used=h.n_expert_used, dense_down=h.dense_down,
        measured={k: float(v) for k, v in measured.items() if isinstance(v, int | float) and not isinstance(v, bool)},
        profiled_hot_fraction=float(hot) if isinstance(hot, int | float) and 0 < hot < 1 else None,
        synthetic=bool(meta.get("synthetic")),
    )  # fmt: skip


# -------------------------------------------------------------------------------------- storage model
def read_time_s(curve: list[dict], size: int) -> float:
    """Seconds of device time one random read of `size` bytes costs at the profile's queue depth:
    1/IOPS interpolated linearly in size between the measured block sizes (a fixed cost per request plus
    a cost per byte; extrapolated from the nearest two points outside them), never less than the bytes
    at the best bandwidth measured. Sizes are rounded up to 512 bytes as the engine's reads are."""
    size = round_up(max(1, int(size)), DIRECT_ALIGN)
    pts = sorted((int(p["block"]), 1.0 / float(p["iops"])) for p in curve)
    best_bw = max(float(p["mb_per_s"]) for p in curve) * 1e6
    if len(pts) == 1:
        b, t = pts[0]
        lin = t * max(1.0, size / b)  # one point: request-bound below it, bandwidth-bound above
    else:
        i = 0
        while i < len(pts) - 2 and size > pts[i + 1][0]:
            i += 1
        (b0, t0), (b1, t1) = pts[i], pts[i + 1]
        lin = t0 + (t1 - t0) * (size - b0) / (b1 - b0)
    return max(lin, size / best_bw)


def curve_anomalies(curve: list[dict]) -> str:
    """What breaks the shape any storage has (larger reads: no more IOPS, no less bandwidth), beyond 15%."""
    pts = sorted(curve, key=lambda p: p["block"])
    out = []
    for a, b in zip(pts, pts[1:], strict=False):
        if b["iops"] > 1.15 * a["iops"]:
            out.append(f"{b['block'] // 1024} KiB reads got more IOPS than {a['block'] // 1024} KiB")
        if b["mb_per_s"] < a["mb_per_s"] / 1.15:
            out.append(f"{b['block'] // 1024} KiB reads got less bandwidth than {a['block'] // 1024} KiB")
    return "; ".join(out)


@dataclass
class Costs:
    whole_s: float  # one cold miss read as a whole bundle
    two_phase_s: float  # gate part, then (with probability precision) the rest
    precision: float
    precision_measured: bool

    @property
    def two_phase_wins(self) -> bool:
        return self.two_phase_s < self.whole_s


def miss_costs(m: ModelFacts, curve: list[dict]) -> Costs:
    p = m.measured.get("precision")
    measured = isinstance(p, float) and 0 < p <= 1
    p = p if measured else 0.5
    whole = read_time_s(curve, m.full_len)
    two = read_time_s(curve, m.gate_len) + p * read_time_s(curve, m.rest_len)
    return Costs(whole, two, p, measured)


# ------------------------------------------------------------------------------------------ the budget
def engine_sizing(m: ModelFacts, budget: int, ctx: int, threads: int, **split) -> dict:
    """The engine's own sizing of this model under `budget` (`pi2-engine size --facts`, the host build; a
    budget of 0 or None: the engine's sizing with no budget, the whole model resident):
    fixed region, neuron cache, and with split=(hot_fraction, hot_share, cluster) the hot/cold split it
    would make. The engine is the one authority on these; the planner only chooses the settings."""
    facts = {"n_embd": m.n_embd, "n_layer": m.n_layer, "n_ff": m.n_ff, "n_head": m.n_head,
             "n_head_kv": m.n_head_kv, "head_dim": m.head_dim, "n_vocab": m.n_vocab,
             "n_expert": m.n_expert if m.arch == "moe" else 0, "n_expert_used": m.n_expert_used,
             "neuron_type": m.neuron_type, "bundle_stride": m.bundle_stride,
             "resident_bytes": m.resident_bytes, "tokenizer_bytes": m.other_bytes,
             "read_align": DIRECT_ALIGN}  # fmt: skip
    # read_align: full_len's unit, the size of the engine's cold slots too (4096 made them 8192 bytes for
    # a 7168-byte bundle: 14% fewer slots than the open makes)
    flags = ["--policy", "powerinfer2", "--ctx", str(ctx), "--threads", str(threads)]
    if budget and budget > 0:  # none: the engine sizes the whole model resident
        flags += ["--memory-budget", str(int(budget))]
    for key, value in split.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return engine_size(facts, flags)


def fixed_parts(size: dict) -> dict:
    """The fixed region of an engine_sizing answer, by part: total, resident, kv_cache, scratch, margin."""
    fx = size["fixed"]
    return {"total": fx["bytes"], "resident": fx["resident_bytes"], "kv_cache": fx["kv_cache_bytes"],
            "scratch": fx["bytes"] - fx["resident_bytes"] - fx["kv_cache_bytes"] - fx["margin_bytes"],
            "margin": fx["margin_bytes"]}  # fmt: skip


def fixed_region(m: ModelFacts, budget: int, ctx: int, threads: int) -> dict:
    """What the engine holds before any neuron is cached, as the engine sizes it (fixed_parts). A budget
    the engine finds too small has no split: its total is then the smallest budget that works."""
    size = engine_sizing(m, budget, ctx, threads)
    if "error" in size:
        return {"total": int(size.get("min_budget_bytes") or budget), "too_small": size["error"]}
    return fixed_parts(size)


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


def coverage(m: ModelFacts, frac: float) -> float:
    """Share of active neurons among the hottest `frac` of a block's neurons: piecewise linear through
    (0, 0), (profiled hot fraction, measured hot coverage) and (1, 1); proportional without a measurement."""
    hf, cov = m.profiled_hot_fraction or ENGINE_DEFAULTS["hot_fraction"], m.measured.get("hot_coverage")
    if cov is None or not 0 < cov < 1:
        return frac
    if frac <= hf:
        return cov * frac / hf
    return cov + (1 - cov) * (frac - hf) / (1 - hf)


def predicted_fraction(m: ModelFacts) -> float:
    """Share of a block's neurons the predictor names per token (measured, else (1 - sparsity) / precision,
    else 25%)."""
    p = m.measured.get("predicted_fraction")
    if p and 0 < p <= 1:
        return p
    s, prec = m.measured.get("sparsity"), m.measured.get("precision")
    if s and prec and 0 < prec <= 1:
        return min(1.0, (1 - s) / prec)
    return 0.25


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
        d = ENGINE_DEFAULTS
        hot, cold = engine_split(d["hot_fraction"], d["hot_share"], d["cluster"])
        return CacheSplit(cache, False, d["hot_fraction"], d["hot_share"], d["cluster"], hot, cold, why=[
            f"no measured hot-set coverage in the model's metadata: engine defaults hot_fraction "
            f"{d['hot_fraction']}, hot_share {d['hot_share']}, cluster {d['cluster']}"])  # fmt: skip
    hf = m.profiled_hot_fraction or ENGINE_DEFAULTS["hot_fraction"]
    hot_wanted = int(hf * F + 0.5)
    cluster = ENGINE_DEFAULTS["cluster"]
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
def cluster_speed(c: dict) -> tuple:
    """How fast a cluster's cores are: capacity first (arm64's cpu_capacity weighs the microarchitecture,
    so two designs at one clock are told apart), max frequency next."""
    return (c.get("capacity") or 0, c["max_mhz"])


def default_compute_threads(clusters: list[dict]) -> int | None:
    """The planner's compute threads on clusters of different speeds: the big and mid cores less the one
    that issues the I/O (at least 1); None where the cores are all alike (then: every core)."""
    clusters = [c for c in clusters if c.get("cpus")]
    if len(clusters) <= 1:
        return None
    fast = sum(len(c["cpus"]) for c in sorted(clusters, key=cluster_speed)[1:])
    return max(1, fast - 1)


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


def pick_membw(profile: dict, threads: int) -> float:
    """Read bandwidth with `threads` threads: the measured row, else linear between the rows around it
    (bandwidth saturates as threads grow, so this errs low), else the nearest row."""
    rows = sorted(profile["membw"], key=lambda r: r["threads"])
    below = [r for r in rows if r["threads"] <= threads]
    above = [r for r in rows if r["threads"] > threads]
    if below and above and below[-1]["threads"] != threads:
        lo, hi = below[-1], above[0]
        f = (threads - lo["threads"]) / (hi["threads"] - lo["threads"])
        return (float(lo["gb_per_s"]) + f * (float(hi["gb_per_s"]) - float(lo["gb_per_s"]))) * 1e9
    return float((below[-1] if below else rows[0])["gb_per_s"]) * 1e9


def make_plan(
    m: ModelFacts,
    profile: dict,
    budget: int,
    *,
    threads: int | None = None,
    ctx: int = DEFAULT_CTX,
    pred_threshold: float | None = None,
    model_path: str = "",
) -> Plan:
    budget = parse_size(budget)  # the one range check every budget gets (pi2cli/units.py)
    if ctx < 1:
        raise Pi2Error(f"--ctx must be at least 1, got {ctx}")
    if pred_threshold is not None:
        if not 0 < pred_threshold < 1:
            raise Pi2Error(f"--pred-threshold must be a probability in (0, 1), got {pred_threshold}")
        if not m.has_predictor:
            raise Pi2Error("--pred-threshold needs a model with activation predictors")
    from pi2cli.plan.profile import validate_profile

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
    if sparse and model_path and Path(model_path).is_file():  # a file: the engine measures it, as bench asks
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
    membw = pick_membw(profile, nthreads)
    info["measured_membw_gb_per_s"] = round(membw / 1e9, 3)
    info["measured_io_method"] = str(profile["storage"].get("method", "?"))
    info["measured_iops_4k_qd32"] = next((round(p["iops"]) for p in curve if p["block"] == 4096), None)
    if info["measured_iops_4k_qd32"] is None:
        del info["measured_iops_4k_qd32"]
    reads = token_misses = 0.0
    per_miss = 0.0
    if sparse:

        def engine_split(hot_fraction, hot_share, cluster):
            c = engine_sizing(m, budget, ctx, nthreads, hot_fraction=hot_fraction, hot_share=hot_share,
                              cluster=cluster)["cache"]  # fmt: skip
            return c["hot_neurons_per_block"], c["cold_slots"]

        split = split_cache(m, cache, engine_split)
        costs = miss_costs(m, curve)
        us = lambda s: f"{s * 1e6:.1f} us"  # noqa: E731
        if not m.two_phase_applies:
            per_miss = costs.whole_s
            why.append(f"two_phase not set: it does not apply to this model ({m.ffn_act} activation, "
                       f"{m.neuron_type} neurons; it needs ReLU-family and Q4 bundles): cold bundles are read whole")  # fmt: skip
        else:
            settings["two_phase"] = costs.two_phase_wins
            per_miss = min(costs.whole_s, costs.two_phase_s)
            prec = f"precision {costs.precision:.2f}" + (
                "" if costs.precision_measured else " (assumed: not measured)"
            )
            verdict = ("two-phase reads (gate part first) are cheaper: storage is bound by bandwidth here"
                       if costs.two_phase_wins else
                       "whole-bundle reads are cheaper: storage is bound by requests per second here")  # fmt: skip
            why.append(f"two_phase {str(costs.two_phase_wins).lower()}: a cold miss costs t({m.full_len} B) = "
                       f"{us(costs.whole_s)} read whole vs t({m.gate_len} B) + {prec} x t({m.rest_len} B) = "
                       f"{us(costs.two_phase_s)} in two phases (t from the storage curve at QD "
                       f"{curve[0].get('qd', '?')}): {verdict}" + ("; moot while everything is preloaded" if split.preload else ""))  # fmt: skip
        why.extend(split.why)
        if not split.preload:
            settings.update(hot_fraction=split.hot_fraction, hot_share=split.hot_share, cluster=split.cluster)
            if m.arch != "moe":  # the engine looks ahead only where the next layer's FFN is known (no router)
                settings["lookahead"] = False
                why.append("lookahead false: reading what the next layer's predictor wants during attention "
                           "costs more reads than the overlap saves (7B shape, 2.68 GiB, 2-core VM, 4 alternated "
                           "pairs: 9.3k against 5.9k reads a token, 1.20-1.39x the time per token)")  # fmt: skip
            pf = predicted_fraction(m)
            per_block = pf * m.n_ff
            hot_hits = per_block * coverage(m, split.hot_neurons / m.n_ff)
            cold_total = m.n_blocks * (m.n_ff - split.hot_neurons)
            cold_hit = min(1.0, split.cold_slots / cold_total) if cold_total else 1.0
            misses = (per_block - hot_hits) * (1 - cold_hit)
            token_misses = misses * m.blocks_per_token
            # a two-phase miss is a gate read plus, where the gate fires (precision), a rest read
            two = m.two_phase_applies and settings.get("two_phase")
            reads = token_misses * ((1 + costs.precision) if two else 1)
            info["predicted_hot_neurons_per_block"] = int(split.hot_neurons)
            info["predicted_hit_rate"] = round(1 - misses / per_block, 4) if per_block else 1.0
            info["predicted_misses_per_token"] = round(token_misses, 1)
            info["predicted_reads_per_token"] = round(reads, 1)
        info["predicted_whole_bundle_us"] = round(costs.whole_s * 1e6, 2)
        if m.two_phase_applies:
            info["predicted_two_phase_us"] = round(costs.two_phase_s * 1e6, 2)
        sparsity = m.measured.get("sparsity", 0.9)
        mem_bytes = (
            m.per_token_resident_bytes + (1 - sparsity) * m.ffn_bytes * m.blocks_per_token / m.n_blocks
        )
        io_s = token_misses * per_miss  # per_miss: a whole read, or both phases' reads
    else:
        mem_bytes = m.per_token_resident_bytes + m.ffn_bytes
        resident_ffn = max(0, budget - fixed["total"])
        paged = max(0, m.ffn_bytes - resident_ffn)
        best_bw = max(float(p["mb_per_s"]) for p in curve) * 1e6
        io_s = paged / best_bw
        if paged:
            why.append(f"dense under this budget pages ~{format_size(paged)} of FFN weights from storage per token "
                       f"(estimate at the best bandwidth measured, {best_bw / 1e6:.0f} MB/s: optimistic)")  # fmt: skip
    why.extend(core_why)
    if pred_threshold is not None:
        settings["pred_threshold"] = pred_threshold
        why.append(f"pred_threshold {pred_threshold}: given on the command line (overrides the model's per-layer "
                   f"thresholds)")  # fmt: skip
    mem_s = mem_bytes / membw
    tbt = max(mem_s, io_s)
    info["predicted_memory_ms"] = round(mem_s * 1e3, 2)
    info["predicted_storage_ms"] = round(io_s * 1e3, 2)
    info["predicted_tbt_ms"] = round(tbt * 1e3, 2)
    info["predicted_tok_s"] = round(1 / tbt, 2) if tbt > 0 else None
    bound = "memory" if mem_s >= io_s else "storage"
    why.append(f"estimate (a bound, not a measurement): {tbt * 1e3:.0f} ms per token = max(memory "
               f"{mem_s * 1e3:.0f} ms: {mem_bytes / 1e9:.2f} GB at {membw / 1e9:.1f} GB/s, storage {io_s * 1e3:.0f} ms"
               + (f": {token_misses:.0f} cold misses ({reads:.0f} reads) at {per_miss * 1e6:.1f} us" if sparse else "")
               + f"), {bound}-bound; compute and reads assumed perfectly overlapped")  # fmt: skip
    info = {k: v for k, v in info.items() if v is not None}
    device = str((profile.get("target") or {}).get("name") or "?")
    if (profile.get("target") or {}).get("emulated"):
        why.append("the profile is from an emulated target: its timings are not the hardware's")
    return Plan(settings=settings, info=info, why=why, model=model_path or m.name, device=device)


# ------------------------------------------------------------------------------------------ plan files
def load_plan(path: str | Path) -> dict:
    """Read and check a plan file as the engine will (known keys only, each the right type)."""
    data = read_json_file(path, "plan")
    validate_plan(data, str(path))
    return data


def validate_plan(data: object, where: str = "plan") -> None:
    check_format(data, where, "plan", "pi2 plan", PLAN_FORMAT, PLAN_VERSION)
    num = (int, float)
    types = {"policy": str, "memory_budget": (str, int), "threads": int, "affinity": str, "hot_fraction": num,
             "hot_share": num, "cluster": int, "two_phase": bool, "lookahead": bool, "io": str, "io_threads": int,
             "io_affinity": str, "pred_threshold": num, "model": str, "device": str, "why": str,
             "created_by": str, "format": str, "version": int}  # fmt: skip
    for key, value in data.items():
        if key.startswith(("predicted_", "measured_")):
            if not isinstance(value, str | int | float | bool):
                raise Pi2Error(f"{where}: {key} must be a scalar")
            continue
        if key not in types:
            raise Pi2Error(f"{where}: unknown key {key!r}")
        want = types[key]
        bad_bool = isinstance(value, bool) and want is not bool
        if bad_bool or not isinstance(value, want):
            raise Pi2Error(f"{where}: {key} has the wrong type ({type(value).__name__})")
    for key in ("hot_fraction", "hot_share"):
        if key in data and not 0 <= data[key] <= 1:
            raise Pi2Error(f"{where}: {key} must be between 0 and 1")
    if "pred_threshold" in data and not 0 < data["pred_threshold"] < 1:
        raise Pi2Error(f"{where}: pred_threshold must be in (0, 1)")
    if "memory_budget" in data:
        parse_size(data["memory_budget"], what=f"{where}: memory_budget")
    if "io" in data and data["io"] not in IO_METHODS:
        raise Pi2Error(f"{where}: io must be one of {', '.join(IO_METHODS)}")
