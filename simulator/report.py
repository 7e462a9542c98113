"""Reports of a simulation: the JSON document, a text table and the plot.

The JSON is `{"scenario": {...}, "policies": {NAME: {slo_attainment, gpu_hours,
scaling_actions, flaps, ttft_p95_ms, itl_p95_ms, ...}}, "oracle": {"gpu_hours", ...}}`.
`itl_p95_ms` is the p95 over requests of each request's mean inter-token latency (the
quantity the per-request SLO is judged on).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from controller.types import DECISION_NUMBERS, Decision
from estimators.types import finite_or_none
from simulator.oracle import OracleResult
from simulator.scenario import PolicyResult, Scenario, policy_changes


def decision_record(d: Decision) -> dict[str, Any]:
    """One governor decision as `governor simulate --decisions` writes it (a JSON line):
    simulated seconds, the replicas and knobs decided, the numbers behind them (req/s,
    factors on the profile, seconds), each stage's replicas in and out with its reason,
    and the `explain` text the service's admin API gives for the same decision."""
    return {
        "at_s": d.at_s,
        "valid": d.valid,
        "replicas": d.replicas,
        "max_num_seqs": d.knobs.max_num_seqs,
        "max_num_batched_tokens": d.knobs.max_num_batched_tokens,
        "knob_reason": d.knob_reason.value,
        **{name: finite_or_none(getattr(d, name)) for name in DECISION_NUMBERS},
        "capacity_limit": d.capacity_limit,
        "panic": d.panic,
        "rollout": d.rollout,
        "stages": [
            {"name": s.name, "before": s.before, "after": s.after, "reason": s.reason.value}
            for s in d.stages
        ],
        "explain": d.explain(),
    }


def document(
    sc: Scenario, results: Mapping[str, PolicyResult], orc: OracleResult | None
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "scenario": {
            "trace": sc.trace.name,
            "requests": len(sc.trace),
            "span_s": sc.trace.span_s,
            "sla_ttft_p95_ms": sc.sla.ttft_p95_ms,
            "sla_itl_p95_ms": sc.sla.itl_p95_ms,
            "profile": sc.profile.name,
            "hpa_sync_s": sc.hpa_sync_s,
            "seed": sc.seed,
            "start_replicas": sc.initial_replicas,
            "scrape_interval_s": sc.scrape_interval_s,
            "cold_start_s": sc.configured_cold_start_s,
            "plant": sc.plant.describe(sc.profile),
        },
        "policies": {name: r.summary() for name, r in results.items()},
        "oracle": orc.summary() if orc is not None else None,
    }
    if changed := policy_changes(sc.governor_policy):
        doc["scenario"]["governor_policy"] = changed
    if orc is not None and orc.gpu_hours > 0:
        for name, r in results.items():
            doc["policies"][name]["oracle_ratio"] = r.gpu_hours / orc.gpu_hours
            if r.gpu_hours_trace is not None:
                doc["policies"][name]["oracle_ratio_trace"] = r.gpu_hours_trace / orc.gpu_hours
    return doc


def table(doc: Mapping[str, Any]) -> str:
    """Fixed-width text table of the policies (and the oracle line). `x oracle`: the
    GPU-hours of the whole run (the drain tail after the trace included) over the
    oracle's; `trace x oracle`: those of the trace's minutes only, what the matrix's
    cells and their goals quote. `speed` is the step-time factor a policy learned of
    the plant (median; the governor's), to read against the scenario's plant speed."""
    cols = (
        "policy",
        "SLO att.",
        "GPU-h",
        "x oracle",
        "trace x oracle",
        "actions",
        "flaps",
        "knobs",
        "TTFT p95",
        "ITL p95",
        "peak q",
        "speed",
    )
    rows = [cols]
    for name, p in doc["policies"].items():

        def f(v: Any, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        rows.append(
            (
                name,
                f"{100 * p['slo_attainment']:.2f}%",
                f(p["gpu_hours"], ".2f"),
                f(p.get("oracle_ratio"), ".2f"),
                f(p.get("oracle_ratio_trace"), ".2f"),
                str(p["scaling_actions"]),
                str(p["flaps"]),
                str(p["knob_changes"]),
                f(p["ttft_p95_ms"], ".0f") + " ms" if p["ttft_p95_ms"] is not None else "-",
                f(p["itl_p95_ms"], ".1f") + " ms" if p["itl_p95_ms"] is not None else "-",
                str(p["peak_queue"]),
                f(p.get("learned_speed"), ".2f"),
            )
        )
    if doc.get("oracle"):
        o = doc["oracle"]
        rows.append(("oracle", ">=99%", f"{o['gpu_hours']:.2f}", "1.00", "1.00", *("-",) * 7))
    widths = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def plot(
    sc: Scenario, results: Mapping[str, PolicyResult], orc: OracleResult | None, path: str | Path
) -> Path:
    """Three panels: load, replicas per policy (with the oracle), p95 TTFT per minute."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    fig, (ax_load, ax_rep, ax_lat) = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    minute = 60.0
    t = sc.trace.arrival_s
    edges = np.arange(0, max(sc.end_s, minute) + minute, minute)
    counts, _ = np.histogram(t, bins=edges)
    ax_load.step(edges[:-1] / 60, counts / minute, where="post", color="black")
    ax_load.set_ylabel("arrivals (req/s)")
    ax_load.set_title(
        f"{sc.trace.name}: {len(sc.trace):,} requests; "
        f"SLA TTFT p95 {sc.sla.ttft_p95_ms:g} ms, ITL {sc.sla.itl_p95_ms:g} ms"
    )
    for name, r in results.items():
        s = r.series
        ax_rep.step(
            np.array(s["t"]) / 60,
            s["total"],
            where="post",
            label=name,
            lw=2.5 if name == "governor" else 1,
            zorder=3 if name == "governor" else 2,
        )
        if "ttft_p95_by_minute" in s:
            ax_lat.plot(
                np.arange(len(s["ttft_p95_by_minute"])) + 0.5,
                s["ttft_p95_by_minute"],
                label=name,
                lw=2.5 if name == "governor" else 1,
                zorder=3 if name == "governor" else 2,
            )
    if orc is not None:
        ax_rep.step(
            np.arange(len(orc.replicas)) * orc.window_s / 60,
            orc.replicas,
            where="post",
            color="grey",
            ls="--",
            label="oracle",
        )
    # Log scale: baselines that pin at 64 must not flatten the governor and the oracle.
    ax_rep.set_yscale("log", base=2)
    ax_rep.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%d"))
    ax_rep.set_ylabel("replicas holding a GPU (log)")
    ax_rep.legend(ncol=4, fontsize=8)
    ax_lat.axhline(sc.sla.ttft_p95_ms, color="red", ls=":", label="SLA")
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("TTFT p95 per minute (ms)")
    ax_lat.set_xlabel("time (minutes)")
    ax_lat.legend(ncol=4, fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
