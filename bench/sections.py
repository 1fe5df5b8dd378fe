"""One docs/benchmarks.md section per scenario: its table, figures and the command that made it."""

from __future__ import annotations

from typing import Any

from .harness import EMBED, FIXED
from .tables import PY, cpu_cell, fmt, table


def p1(d: dict[str, Any]) -> list[str]:
    rows = []
    for model in (FIXED, EMBED):
        x = d[model]
        o, di = x["overspill"], x["direct"]
        rows.append([model, o["items"], o["items_per_s"], di["items_per_s"], di["concurrency"],
                     ", ".join(f"{c}: {v:,.0f}" for c, v in di["probes"].items()), x["ratio"],
                     o["breakdown"].get("batch_size", 0), o.get("items_per_package")])  # fmt: skip
    out = ["## P1 bulk: `submit_many` on the bulk lane vs full direct batches", "",
           f"Command: `{PY} p1`. Overspill: items submitted 1 024 per `submit_many` call (written as chunks "
           "of 256 jobs, one record and one arq job each), "
           "then `wait_many`; the clock runs from the first submit to the last result. Direct: the same "
           "Triton model, 64 items per gRPC request, at the best of concurrency 1, 2, 4 (probed first).", ""]  # fmt: skip
    out += table(["model", "items", "overspill items/s", "direct items/s", "best conc.", "direct probes",
                  "ratio", "mean batch", "items/arq job"], rows)  # fmt: skip
    out += ["CPU milliseconds per item, by process (all repetitions):", ""]
    out += table(["model", "overspill", "direct"],
                 [[m, cpu_cell(d[m]["overspill"].get("cpu_ms_per_item", {})),
                   cpu_cell(d[m]["direct"].get("cpu_ms_per_item", {}))] for m in (FIXED, EMBED)])  # fmt: skip
    return out


def p2(d: dict[str, Any]) -> list[str]:
    rows = []
    for model in (FIXED, EMBED):
        x = d[model]
        o = x["overspill"]
        rows.append([model, x["users"], o["items_per_s"], o.get("p50_ms"), o.get("p99_ms"), x["naive"]["items_per_s"],
                     x["naive"].get("p50_ms"), x["direct"]["items_per_s"], x["vs_naive"], x["vs_direct"],
                     o["breakdown"].get("batch_size", 0), o.get("items_per_package")])  # fmt: skip
    out = ["## P2 interactive: single-item jobs through `Client.submit` + `wait`", "",
           f"Command: `{PY} p2`. Overspill: a closed loop of concurrent users, each submitting one "
           "single-text embedding job and waiting for it (the client coalesces concurrent submits). "
           "Naive: one synchronous single-item gRPC request after another, no queue. Direct: as P1.", ""]  # fmt: skip
    out += table(["model", "users", "overspill jobs/s", "p50 ms", "p99 ms", "naive/s", "naive p50 ms",
                  "direct batched/s", "÷ naive", "÷ direct", "mean batch", "items/arq job"], rows)  # fmt: skip
    out += ["CPU milliseconds per job, by process:", ""]
    out += table(
        ["model", "overspill"],
        [[m, cpu_cell(d[m]["overspill"].get("cpu_ms_per_item", {}))] for m in (FIXED, EMBED)],
    )
    return out


BREAK = ("queued_ms", "batch_ms", "infer_ms", "total_ms", "after_write_ms", "e2e_ms", "batch_size")


def p3(d: dict[str, Any]) -> list[str]:
    out = ["## P3 latency vs load (open loop)", "",
           f"Command: `{PY} p3`. Arrivals at a fixed rate (10 %, 50 %, 90 % of the P2 capacity measured in "
           "the same run), each a single-item job, after 1 s of the same load; latency from the *scheduled* "
           "arrival to the result read, so a lagging generator cannot hide queueing. Direct: the same arrivals as single-item "
           "async gRPC requests straight to Triton (its dynamic batcher merges them).", "",
           "![latency vs load](img/latency_vs_load.png)", ""]  # fmt: skip
    rows, brk = [], []
    for model, x in d.items():
        for row in x["levels"]:
            o, di = row["overspill"], row["direct"]
            rows.append([model, f"{row['level']:.0%}", row["offered_per_s"], o.get("p50_ms"), o.get("p95_ms"),
                         o.get("p99_ms"), o["failed"], di.get("p50_ms"), di.get("p95_ms"), di.get("p99_ms"),
                         di["failed"], row["p99_ratio"]])  # fmt: skip
            brk.append([model, f"{row['level']:.0%}", *[o["breakdown"].get(k, 0) for k in BREAK],
                        o.get("items_per_package"), cpu_cell(o.get("cpu_ms_per_item", {}))])  # fmt: skip
    out += table(["model", "load", "offered/s", "p50", "p95", "p99", "failed", "direct p50", "direct p95",
                  "direct p99", "failed", "p99 ratio"], rows)  # fmt: skip
    out += ["Where overspill's time goes (means, ms, from each result envelope's `timings`; "
            "`after_write` = end to end − `total_ms`: the client noticing and reading the result):", ""]  # fmt: skip
    out += table(["model", "load", "queued", "batch wait", "infer", "total (→ written)", "after write",
                  "end to end", "batch size", "items/arq job", "CPU ms per job"], brk)  # fmt: skip
    return out


def p4(d: dict[str, Any]) -> list[str]:
    out = ["## P4 overflow to a remote at 3× local capacity", "", f"Command: `{PY} p4`.", ""]
    if not d.get("run"):
        return out + [f"Not run: {d.get('reason')}.", ""]
    out += [f"The fixed-cost model is slowed to {d['exec_ms']:.0f} ms per execution (local capacity "
            f"≈ {d['on']['local_capacity_per_s']:.0f} items/s at batch 64); the fake remote "
            f"(`stack.fake_remote`) answers after {d['remote_latency_ms']:.0f} ms. Open-loop single-item "
            "interactive jobs at 3× local capacity; overflow off = `OVERSPILL_GATEWAY_MODE=triton`. "
            "Local busy = Triton compute time ÷ wall time.", ""]  # fmt: skip
    rows = [[("on" if x["overflow"] else "off"), x["offered_per_s"], x["items"], x["failed"], x["items_per_s"],
             x.get("p50_ms"), x.get("p99_ms"), x["p99_wait_s"], x["remote_share"], x["local_busy_fraction"],
             x.get("local_mean_batch", "")] for x in (d["on"], d["off"])]  # fmt: skip
    out += table(["overflow", "offered/s", "done", "failed", "done/s", "p50 ms", "p99 ms", "p99 s",
                  "remote share", "local busy", "local mean batch"], rows)  # fmt: skip
    out += ["CPU milliseconds per job, by process:", ""]
    return out + table(["overflow", "CPU"], [["on", cpu_cell(d["on"].get("cpu_ms_per_item", {}))],
                                             ["off", cpu_cell(d["off"].get("cpu_ms_per_item", {}))]])  # fmt: skip


def p5(d: dict[str, Any]) -> list[str]:
    r, w = d["redis"], d["worker"]
    out = ["## P5 memory", "",
           f"Command: `{PY} p5`. {r['jobs']:,} single-text embedding jobs (≈ {r['input_chars']:.0f} "
           "characters each) queued on the bulk lane with `submit_many`, on a prefix no worker serves; "
           "`INFO memory` `used_memory` before and after. They are written as chunks of up to 256 jobs (one "
           "hash and one package each), which are independent keys, so the figure scales linearly: the 1 M "
           "column is that arithmetic, not a measurement.", ""]  # fmt: skip
    out += table(["jobs", "keys", "bytes/job", "→ 1 M jobs (MiB)", "enqueue jobs/s"],
                 [[r["jobs"], r["keys"], r["bytes_per_job"], r["projected_1m_jobs_mb"], r["enqueue_per_s"]]])  # fmt: skip
    out += [f"Worker RSS (VmRSS) 1 s after start and after processing {w['jobs']:,} fixed-cost jobs:", ""]
    out += table(["RSS at start (MiB)", "RSS after (MiB)"], [[w["rss_start_mib"], w["rss_after_mib"]]])
    if "idle_cores" in w:
        out += [f"CPU (cores) used over {w['idle_seconds']:.0f} s by a started worker with no work, and by "
                f"the others meanwhile: {cpu_cell(w['idle_cores'])}.", ""]  # fmt: skip
    return out


def p6(d: dict[str, Any]) -> list[str]:
    out = ["## P6: coalesced single-item requests vs arq's own ceiling", "",
           f"Command: `{PY} p6`. The P2 fixed-cost figure (async client, coalescing on) against a stock arq "
           "worker running a no-op function with `max_jobs` 256 and `poll_delay` 5 ms, timed from the "
           "instant its deferred jobs fall due to an empty queue; against the same client with "
           "`coalesce_window_ms=None` (one arq job per request); and single-item `POST /v1/embeddings` calls "
           "through a real API process, authenticated as a tenant, from a closed loop of keep-alive "
           "connections (same number of users).", ""]  # fmt: skip
    rows = [["coalesced (P2)", d["coalesced_items_per_s"], "", ""]]
    one = d.get("one_job_per_request")
    if one:
        rows.append(["one arq job per request", one["items_per_s"], one.get("p50_ms"), one.get("p99_ms")])
    api = d.get("api")
    if api:
        rows.append(["HTTP API (coalesced)", api["items_per_s"], api.get("p50_ms"), api.get("p99_ms")])
    rows.append(["arq no-op jobs", d["noop"]["jobs_per_s"], "", ""])
    out += table(["path", "per second", "p50 ms", "p99 ms"], rows)
    h = d["half_load"]
    out += [f"At 50 % load ({h['offered_per_s']:,.0f}/s, open loop, {len(h.get('p99s_ms', [0]))} runs of "
            f"{h.get('seconds', 0):.0f} s after 1 s of the same load, the run with the median p99; p99 of each: "
            f"{', '.join(fmt(v) for v in h.get('p99s_ms', []))} ms): p50 {fmt(h.get('p50_ms'))} ms, "
            f"p99 {fmt(h.get('p99_ms'))} ms, {fmt(h.get('items_per_package'))} items per package; the goal is "
            f"≤ {d['p99_goal_ms']:.0f} ms = 2 × (5 ms coalescing window + 2 ms batch window + 5 ms model). "
            f"Mean breakdown: {breakdown_text(h.get('breakdown', {}))}.", ""]  # fmt: skip
    return out


def breakdown_text(b: dict[str, float]) -> str:
    names = {"queued_ms": "queued (incl. coalescing)", "batch_ms": "in the batcher", "infer_ms": "Triton call",
             "after_write_ms": "result write to caller", "e2e_ms": "end to end"}  # fmt: skip
    return ", ".join(f"{label} {b[k]:.1f} ms" for k, label in names.items() if k in b) or "n/a"


def sweep(d: dict[str, Any]) -> list[str]:
    out = ["## Scaling: batch window sweep, and 1 vs 2 worker processes", "",
           f"Command: `{PY} sweep`. The worker's batcher for the fixed-cost model is configured through "
           "`OVERSPILL_MODELS` (`max_wait_ms` × `max_batch`); each point is a fresh worker and closed loops "
           "of single-item jobs at saturation (median of the repetitions).", "", "![batch window sweep](img/batch_window.png)", ""]  # fmt: skip
    rows = [[p["max_batch"], p["max_wait_ms"], p["items_per_s"], p.get("p50_ms"), p.get("p99_ms"),
             p["breakdown"].get("batch_size", 0)] for p in d["points"]]  # fmt: skip
    out += table(["max_batch", "max_wait_ms", "items/s", "p50 ms", "p99 ms", "mean batch"], rows)
    rows = [[w["workers"], w["interactive"]["items_per_s"], w["interactive"].get("p99_ms"), w["bulk"]["items_per_s"]]
            for w in d["workers"]]  # fmt: skip
    out += table(["worker processes", "interactive items/s", "interactive p99 ms", "bulk items/s"], rows)
    return out


def chat(c: dict[str, Any]) -> list[str]:
    """Chat tokens/s, from ``python -m bench.chat`` (its own run: the chat model only)."""
    out = ["## Chat: tokens/s, continuous vs static batching", "",
           f"`{c['command']}` ({c['measured_at']}; its own Triton with the `chat` model only, decoupled: "
           f"one gRPC stream per conversation): greedy {c['max_tokens']}-token completions of SmolLM2-135M "
           "on llama.cpp, 2 threads, 8 sequence slots.", ""]  # fmt: skip
    rows = [
        ["direct, 1 conversation at a time", c["direct_batch1_tok_s"], ""],
        ["direct, 8 concurrent conversations", c["direct_batch8_tok_s"], f"{c['batch8_vs_batch1']}x one at a time"],
        ["overspill, 8 concurrent chat jobs", c["overspill_8_concurrent_tok_s"], f"mean batch {c['overspill_mean_batch']}"],
    ]  # fmt: skip
    if "chat_tokens_per_s_continuous" in c:
        n = c.get("continuous_vs_static_conversations", "")
        rows += [
            [f"continuous batching, {n} conversations, max_tokens 8-128", c["chat_tokens_per_s_continuous"],
             f"{c['chat_tokens_per_s_continuous_vs_static']}x static"],
            [f"static batching, the same {n}", c["chat_tokens_per_s_static"], ""],
        ]  # fmt: skip
    if "chat_tokens_per_s_continuous_fixed_step" in c:
        step = c.get("fixed_step_ms", 20)
        rows += [
            [f"fixed-step stand-in ({step} ms a step for any batch), continuous, "
             f"{c.get('fixed_step_conversations', n)} conversations, max_tokens 8-128",
             c["chat_tokens_per_s_continuous_fixed_step"], f"**{c['chat_tokens_per_s_continuous_vs_static_fixed_step']}x** static"],
            ["fixed-step stand-in, static, the same", c["chat_tokens_per_s_static_fixed_step"], ""],
        ]  # fmt: skip
    out += table(["path", "tokens/s (all sequences)", ""], rows)
    if "chat_tokens_per_s_continuous_fixed_step" in c:
        out += ["SmolLM2 on 2 CPU cores is compute-bound: 8 conversations decoded together give "
                f"{c['batch8_vs_batch1']}x the tokens/s of one at a time, not 8x, so keeping the slots full "
                "buys little there. The fixed-step stand-in (`engine: fixed_step` in the chat model's config, "
                "`model_repository/chat/1/fixedstep.py`) runs the same scheduler with a step that costs the "
                "same for any batch, as memory-bound decoding on a GPU, and decodes joining prompts in the step "
                "they join, as GPU servers do: there, continuous batching keeps the slots full while static "
                "batching waits for each batch's longest conversation. `python -m bench.chat --fixed-step` "
                "measures only that pair (a minute).", ""]  # fmt: skip
    if "chat_ttft_direct_p50_ms" in c:
        out += [f"Time to first token straight from Triton, {c['chat_ttft_direct_concurrency']} in flight: "
                f"p50 {c['chat_ttft_direct_p50_ms']} ms, p99 {c['chat_ttft_direct_p99_ms']} ms.", ""]  # fmt: skip
    return out


def chat_ttft(c: dict[str, Any]) -> list[str]:
    """Streamed time to first token through the API vs straight from Triton (``bench.chat_ttft``)."""
    out = ["## Chat: time to first token through the queue", "",
           f"`{c['command']}` ({c['measured_at']}): {c['conversations']} streamed conversations, "
           f"{c['concurrency']} in flight (half the model's slots), {c['max_tokens']} tokens each.", ""]  # fmt: skip
    rows = [
        ["through the API (SSE)", c["chat_ttft_p50_ms"], c["chat_ttft_p99_ms"]],
        ["straight from Triton (gRPC stream)", c["chat_ttft_direct_p50_ms"], c["chat_ttft_direct_p99_ms"]],
        ["the queue path alone (submit to worker start + first delta to client)",
         c["chat_ttft_queue_path_p50_ms"], c["chat_ttft_queue_path_p99_ms"]],
    ]  # fmt: skip
    out += table(["path", "p50 ms", "p99 ms"], rows)
    out += [
        f"`chat_ttft_overhead_p50_ms` (median of per-round differences): {c['chat_ttft_overhead_p50_ms']}.",
        "",
    ]
    return out


def chaos(c: dict[str, Any]) -> list[str]:
    d = c["details"]
    out = ["## Chaos: faults under load, every job counted", "",
           f"Command: `{c['command']}` (its own Redis with AOF, Triton with `fixed_cost` at {c['exec_ms']:g} ms "
           f"per execution, {c.get('kill_exec_ms', c['exec_ms']):g} ms in the no_fault and kills runs so that "
           "the kills land while work is left; two workers with the default settings (20 s time limit), "
           "a new one started after each kill; measured " + c["measured_at"] + ").", ""]  # fmt: skip
    rows = [[name, r["jobs"], r["succeeded"], r["not_terminal"], r["double_writes"], r["mean_attempts"],
             r["max_attempts"], r.get("seconds", r.get("terminal_s_after_restart", "–"))]
            for name, r in d.items() if "jobs" in r]  # fmt: skip
    out += table(["run", "jobs", "succeeded", "not terminal", "written twice", "mean attempts", "max attempts",
                  "seconds"], rows)  # fmt: skip
    out += ["", f"Goodput with {d['kills']['kills']} SIGKILLs vs none: **{c['chaos_goodput_vs_nofault']}**; "
            f"after the Redis restart every job was terminal in {c['chaos_redis_terminal_s']} s "
            f"(same worker process: {d['redis']['same_worker']}). An attempt is counted when a worker starts "
            "a job's package, so the work a killed worker held (at most its 2 s admission hold) counts twice "
            "though most of it was never computed; results are written as each backend batch returns, so "
            "only the batches in flight at a kill are computed again.", ""]  # fmt: skip
    if "startup" in d:
        k = d["kills"].get("kill_to_reclaim_s", [])
        out += [f"Recovery: from a kill to the first package of the killed worker run again elsewhere, "
                f"p99 **{c.get('chaos_kill_to_reclaim_s')} s** over {len(k)} kills (the lease, 5 s, runs out "
                f"first; range {min(k, default=0):g}–{max(k, default=0):g} s). A worker launched with work "
                f"queued returns its first result in **{c.get('worker_start_to_first_result_s')} s** (runs: "
                f"{d['startup']['first_result_s']}); starting Python and importing the worker alone take "
                f"{d['startup']['imports_s']} s.",
                ""]  # fmt: skip
    if "kills_one" in d:
        one = d["kills_one"]
        out += [f"One worker only, SIGKILLed {one['kills']} times 2 s apart and restarted each time: "
                f"{one['seconds']} s against {d['no_fault_one']['seconds']} s without kills, goodput "
                f"**{c['chaos_goodput_one_worker']}**. Its packages come back when their lease runs out, and "
                "meanwhile the new worker claims fresh work. What each kill costs: the execution running in "
                "Triton when the worker dies, and the one already handed to the model, are computed for "
                "nobody (the requests still queued are answered CANCELLED without work: the models check), "
                "and the new worker's first requests run half full while Triton is idle.", ""]  # fmt: skip
    for name, what in (("slowdown", "Slowdown: the model's cost raised 5× ({:g} → {:g} ms per execution)"),
                       ("cpu_hog", "CPU hog: {} busy-looping processes competing for the 2 cores{}")):  # fmt: skip
        if name not in d:
            continue
        s = d[name]
        fault = what.format(c.get("kill_exec_ms", 0), s["slow_exec_ms"]) if name == "slowdown" \
            else what.format(s.get("hogs"), "")  # fmt: skip
        rate = s.get("degraded_items_s", s.get("slow_items_s"))
        direct = s.get("direct_degraded_items_s", s.get("direct_slow_items_s"))
        out += [f"{fault} for 15 s mid-run, with a {s['time_limit_s']:g} s time limit: "
                f"**{rate} items/s** meanwhile against {direct} items/s from the same Triton directly under "
                f"the same fault, goodput **{s['goodput']}**; {s['timeouts']} packages timed out, "
                f"{s['empty_timeouts']} of them with nothing kept.", ""]  # fmt: skip
    return out


def batch_memory(run: dict[str, Any], baseline: dict[str, Any] | None) -> list[str]:
    d = run["details"]
    out = ["## Batch: peak Redis memory of a 50,000-line embedding batch", "",
           f"Command: `{PY} batchmem` (measured {run['measured_at']}): one worker, `fixed_cost`, the batch run "
           "through Redis (`overspill bulk`'s Redis backend), `used_memory` sampled every 50 ms; the figure "
           "is the peak above the memory before the batch.", ""]  # fmt: skip
    rows = []
    if baseline:
        b = baseline["details"]
        rows.append(["every result held until the batch ends (the same command before commit 7f8172a)", baseline["batch_peak_redis_mib_50k"],
                     b["seconds"], b["completed"]])  # fmt: skip
    rows.append(["lines written to the output file as they finish, window 4 096", run["batch_peak_redis_mib_50k"],
                 d["seconds"], d["completed"]])  # fmt: skip
    out += table(["batch", "peak Redis MiB", "seconds", "completed"], rows)
    if baseline and d["seconds"] > baseline["details"]["seconds"]:
        out += [f"The window cost this run {d['seconds'] / baseline['details']['seconds'] - 1:.0%} more wall time: "
                "the driver submits the next lines only at its next step (`OVERSPILL_BATCH_POLL_S`); a wider "
                "`OVERSPILL_BATCH_WINDOW_LINES` trades Redis memory for it.", ""]  # fmt: skip
    return out


def profile_tables(p: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name in [n for n in ("worker", "client", "api") if n in p]:
        x = p[name]
        out += [f"{name} ({x['samples']:,} samples, {x['idle_pct']:g} % idle in `select`):", ""]
        out += table(["function", "% own"], [[f"`{fn}`", pct] for fn, pct in x["own"][:10]])
    return out


def profile_section(
    p: dict[str, Any], interactive: dict[str, Any] | None, api: dict[str, Any] | None
) -> list[str]:
    out = ["## Profile: where the queue path spends its CPU (py-spy)", "",
           f"Command: `{PY} profile` (measured {p['measured_at']}): {p['items']:,} single-text fixed-cost jobs on "
           f"the bulk lane ({p['items_per_s']:,} items/s while sampled), py-spy at 250 Hz on the worker and on the "
           "client for 10 s. Share of samples by the function running (own time):", ""]  # fmt: skip
    out += profile_tables(p)
    if interactive:
        out += [f"The same with `{PY} profile --interactive` (measured {interactive['measured_at']}): 256 "
                f"concurrent `submit` + `wait` loops ({interactive['items_per_s']:,} items/s while sampled):", ""]  # fmt: skip
        out += profile_tables(interactive)
    if api:
        out += [f"And with `{PY} profile --api` (measured {api['measured_at']}): 64 keep-alive HTTP users of "
                f"`POST /v1/embeddings` on an API process with a tenants file, logging at its default level "
                f"({api['items_per_s']:,} requests/s while sampled; the API runs on uvloop, whose waits "
                "py-spy shows inside `Runner.run`):", ""]  # fmt: skip
        out += profile_tables(api)
    out += ["What the profiles showed, and what was done:",
            "- The client, reading 60 000 results, spent most of its time packing Redis commands: each pass sent "
            "one `HGET` per pending job, then one `HGETALL` per finished one. One script call per 2,000 pending "
            "jobs now returns the finished ones with their envelopes (`producer/contract/collect.lua`): the "
            "client's samples over the same 10 s fell from 2,112 to 1,224.",
            "- Bulk jobs are now written as chunks (one hash and one package per 256 jobs, "
            "`producer/contract/chunks.py`). The first profile of chunks (6,150 items/s while sampled) showed "
            "the client's reader parsing every pending id with a regex on every pass (`chunk_of`, 36 % of "
            "the client): ids are now parsed once per `iter_results`. The worker built each result with "
            "pydantic's `model_construct` (7.6 %): results are built by a constructor that skips its "
            "per-field defaults (`trusted` in `producer/contract/envelope.py`); the ledger looked up its "
            "Prometheus children by labels per result (about 6 %): they are cached per tenant, model and route.",
            "- The next profile (8,475 items/s) had the client packing an `HMGET` of every pending job's "
            "field on every pass (35 % of the client in `pack_command` and `encode`): a chunk's hash now "
            "counts its finished jobs (`d`), a pass reads three fields per chunk and asks for envelopes "
            "only where that count moved. The client's samples fell from 576 to 327 over the same 10 s.",
            "- Until 2026-12-07 the load generator ran with its garbage collector off and kept every "
            "envelope, unlike a user's program. It now runs with the collector on and keeps numbers only. "
            "In the same change `iter_results` decodes each envelope when it hands it on, where it decoded a "
            "pass's worth first (up to 2,000 results with 384 floats each, alive together for the "
            "collector to walk): the bulk client's CPU per item fell from 0.067–0.079 to 0.045 ms.",
            "- Under interactive load the largest single costs are socket writes (the worker's result "
            "writes in `JobStore.finish`, the client's submissions), gRPC calls and pydantic validation of "
            "requests in the worker (kept: the worker does not trust what is on the queue). What is left "
            "is spread thin; cutting it further means fewer Redis round trips per package and results as "
            "binary vectors rather than JSON envelopes.",
            "- Profiles of 2026-12-06 (6,400–6,900 bulk items/s unsampled): redis-py's asyncio connections "
            "pack commands in Python (`pack_command`, 8 % of the interactive client, 4 % of the worker): "
            "clients from `producer.contract.connect` pack with hiredis's C packer, the same bytes. "
            "pydantic's `model_fields`, a Python-level property since 2.11, was 3 % of the bulk worker "
            "inside `trusted`: the field count is read once per class. The worker's own "
            "`overspill_gc_pause_ms` summed 0.33–0.76 s of collection per 30,000 bulk jobs with Python's "
            "thresholds (700, 10, 10): thousands of jobs in flight were promoted and walked again by full "
            "collections; at (25000, 20, 20) (`OVERSPILL_GC_THRESHOLD`) 0.05–0.22 s, and worker CPU per job "
            "fell 10 % in paired runs (`.venv/bin/python -m bench.gc_pauses`). The job scripts "
            "take 10.9 Redis commands per interactive job where they took 21.9 "
            "(`.venv/bin/python -m bench.redis_cost`): no `TYPE` checks (a key of another type answers "
            "`HMGET` or `RPUSH` with an error `pcall` returns), one `HSET` per submission and per start, "
            "no `EXISTS` per finish (the record says whether the job has a stream), and the reply "
            "list's lifetime renewed when it starts or passes a multiple of 256, not on every reply.",
            "- Blocks (2026-12-07, `workers/blocks/`): the bulk worker's profile had been flat over per-item "
            "work, each a few percent (`model_dump_json`, the ledger's record, `trusted`, the admission "
            "walk, `parse_body`, `Decider.decide`, per item). A chunk of texts now runs as a block (one route, "
            "the texts batched as columns, one stored value per Triton request), and the worker's own time is "
            "the event loop's socket writes and gRPC calls. The client's first profile with blocks had "
            "hiredis decoding each block as text (26 %) and the reader encoding it back (15 %): blocks are "
            "read with `NEVER_DECODE`. What is left in the client is making envelopes from rows "
            "(`ResultBlock.envelope`, mostly `tolist` of 384 floats, for callers of `iter_results` who asked "
            "for floats); `iter_arrays` makes none.",
            "- The API's profile (`profile --api`): uvicorn's protocol and socket writes 17 % of its samples, "
            "Starlette's and FastAPI's layers 13 %, the per-request JSON log line (structlog) 8 %, "
            "serializing 384 floats (`BodyResponse.render`) 6 %. No single cost is large enough to halve it.",
            ""]  # fmt: skip
    return out


def rss_curve(run: dict[str, Any]) -> list[str]:
    w = run["details"]["p5"]["worker"]
    out = [f"## Worker RSS over {w['jobs']:,} jobs", "",
           f"Command: `{PY} p5 --rss-jobs {w['jobs']}` (measured {run['started_at']}). One worker runs "
           "fixed-cost single-text jobs on the bulk lane, 20,000 at a time, Redis flushed between them; its "
           f"VmRSS after each tenth. At start (1 s after launch): {w['rss_start_mib']} MiB.", ""]  # fmt: skip
    samples = w["rss_samples_mib"]
    out += table(["jobs done", *[f"{n:,}" for n, _ in samples]], [["RSS (MiB)", *[m for _, m in samples]]])
    (n0, first), (n1, last) = samples[0], samples[-1]
    if n1 > n0:
        per_job = (last - first) * 2**20 / (n1 - n0)
        out += [f"From {n0:,} to {n1:,} jobs the RSS moved from {first:g} to {last:g} MiB ({per_job:.1f} bytes "
                f"per job; samples within {min(m for _, m in samples):g}–{max(m for _, m in samples):g} MiB), "
                f"against {first - w['rss_start_mib']:.1f} MiB over the first {n0:,}: most of the growth is front-loaded. "
                "Which one-time allocations make up the "
                "first step was not broken down.", ""]  # fmt: skip
    return out
