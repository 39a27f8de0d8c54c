"""pi2 driven over its server vs over its pipe: decode tok/s of `pi2 bench --via server` and `--via pipe`
on the same model and settings, alternated (pipe, server, pipe, server, ...) so drift on a shared
machine falls on both alike; prints each run, the medians and their ratio (server / pipe).

    python benchmarks/via_server.py -m DIR/model.pi2 --pairs 3 -n 32 --limit 1 -t 2 [--json-out F]

Issue 35's acceptance: the two within 5% (ratio in [0.95, 1.05]). The figure is the bench's own decode
statistic (schema.decode_rate: all decode tokens over all decode time), each run one process of its kind
holding the model for the whole workload.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pi2cli.bench.run import BenchConfig, run_bench  # noqa: E402
from pi2cli.results import schema  # noqa: E402


def one(args, via: str, results: str) -> dict:
    cfg = BenchConfig(model=args.model, engines=["pi2"], workloads=[args.workload], limit=args.limit,
                      n_gen=args.n_gen, threads=args.threads, results_dir=results, via=via,
                      budgets=[args.memory_budget])  # fmt: skip
    (outcome,) = run_bench(cfg)
    run = outcome.run
    if run["status"] != schema.STATUS_OK:  # e.g. invalid: a floor measured on a busy machine; said, left out
        print(f"{via:6s} {run['status']}: {run['error']} (left out)", flush=True)
        return {"via": via, "status": run["status"], "error": run["error"], "decode_ts": None}
    s = run["summary"]
    return {"via": via, "decode_ts": schema.decode_rate(run), "tbt_p50_ms": s["tbt_p50_ns"] / 1e6,
            "ttft_ms": s["ttft_avg_ns"] / 1e6, "n_gen_total": s["n_gen_total"], "policy": run["engine"]["policy"]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--pairs", type=int, default=3, help="pipe+server pairs, alternated [3]")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="tokens per turn [32]")
    ap.add_argument("-w", "--workload", default="multi-turn")
    ap.add_argument("--limit", type=int, default=1, help="conversations [1]")
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--memory-budget", type=int, default=None, help="bytes (the engine's and the cgroup's)")
    ap.add_argument("--json-out", default=None, help="also write the runs and the ratio as JSON here")
    ap.add_argument("--note", default="", help="stored in the JSON (machine, load)")
    args = ap.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="pi2-via-") as results:
        for i in range(args.pairs):
            for via in ("pipe", "server") if i % 2 == 0 else ("server", "pipe"):  # ABBA: neither always first
                r = one(args, via, results)
                runs.append(r)
                if r["decode_ts"] is None:
                    continue
                print(
                    f"{via:6s} decode {r['decode_ts']:8.2f} tok/s  TBT p50 {r['tbt_p50_ms']:7.2f} ms  "
                    f"TTFT {r['ttft_ms']:8.1f} ms  ({r['n_gen_total']} tokens, {r['policy']})",
                    flush=True,
                )
    ok = {
        v: [r["decode_ts"] for r in runs if r["via"] == v and r["decode_ts"] is not None]
        for v in ("pipe", "server")
    }
    if not ok["pipe"] or not ok["server"]:
        raise SystemExit("via_server: no finished run of one of the two: no ratio")
    med = {v: statistics.median(ok[v]) for v in ("pipe", "server")}
    ratio = med["server"] / med["pipe"]
    verdict = "within 5%" if abs(ratio - 1) <= 0.05 else "NOT within 5%"
    print(
        f"median decode: pipe {med['pipe']:.2f} tok/s, server {med['server']:.2f} tok/s; "
        f"server/pipe {ratio:.3f} ({verdict})"
    )
    if args.json_out:
        out = {"model": str(args.model), "workload": args.workload, "limit": args.limit, "n_gen": args.n_gen,
               "threads": args.threads, "memory_budget": args.memory_budget, "pairs": args.pairs,
               "median_decode_ts": med, "ratio_server_over_pipe": round(ratio, 4), "runs": runs,
               "note": args.note, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
        Path(args.json_out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    from pi2cli.errors import Pi2Error

    try:
        main()
    except Pi2Error as exc:  # a model without a chat template, a missing build: one line, as pi2 says it
        sys.exit(f"via_server: error: {exc}")
