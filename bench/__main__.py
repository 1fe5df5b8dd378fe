"""``python -m bench NAME``: p1, p2, p3, p4, p5, p6, sweep, all, smoke, report, chaos, profile, batchmem, scale, tokens, console, litellm, webhooks, openloop."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import batchmem, chaos, console, litellm, openloop, profile, report, scale, tokens, webhooks
from .runner import ALL, REQUIRED_KEYS, RESULTS_DIR, SCENARIOS, run
from .sizes import FULL, SMOKE

NAMES = (
    *SCENARIOS,
    "all",
    "smoke",
    "report",
    "chaos",
    "profile",
    "batchmem",
    "scale",
    "tokens",
    "console",
    "litellm",
    "webhooks",
    "openloop",
)


def print_ratios(result: dict[str, Any], path: Path) -> None:
    print(f"results: {path}")
    for key, value in result.items():
        if isinstance(value, int | float | list) and not isinstance(value, bool) or value is None:
            if key.startswith(("p", "sweep", "workers")) and key != "duration_s":
                print(f"  {key:38s} {value}")
    print(f"  {'duration_s':38s} {result['duration_s']}")
    missing = [k for k in REQUIRED_KEYS if k not in result]
    if missing:
        print(f"  not measured in this run: {', '.join(missing)}")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the harness, which stops every server it started


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("name", choices=NAMES)
    parser.add_argument(
        "--out", type=Path, help="results directory (default bench/results; smoke: a temp dir)"
    )
    parser.add_argument(
        "--rss-jobs",
        type=int,
        help=f"P5: jobs a worker runs between RSS readings (default {FULL.rss_jobs:,})",
    )
    parser.add_argument(
        "--interactive", action="store_true", help="profile: P2's closed loop instead of bulk"
    )
    parser.add_argument("--bulk", action="store_true", help="chaos: the runs on the bulk lane (blocks)")
    parser.add_argument(
        "--api", action="store_true", help="profile: P6's HTTP users on an API process instead of bulk"
    )
    parser.add_argument(
        "--remote",
        action="store_true",
        help="profile: HTTP users of a remote-only chat model instead of bulk",
    )
    args = parser.parse_args(argv)
    full = replace(FULL, rss_jobs=args.rss_jobs) if args.rss_jobs else FULL
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.name == "report":
        print(report.generate(args.out or RESULTS_DIR))
        return 0
    if args.name == "batchmem":  # peak Redis memory while a 50 000-line batch runs
        print(json.dumps(batchmem.main(), indent=2))
        return 0
    if args.name == "profile":  # py-spy samples of the worker and the client under bulk load
        print(
            json.dumps(
                profile.main(interactive=args.interactive, through_api=args.api, remote=args.remote), indent=2
            )
        )
        return 0
    if args.name == "chaos":  # its own servers and faults: not part of `all`
        result = chaos.main(bulk=args.bulk)
        print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
        return 0
    if args.name == "tokens":  # mixed-length texts on the real embedding model
        result = tokens.main()
        print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
        return 0
    if args.name == "console":  # the console's pages, screenshots, and its load time at 1 000 000 queued jobs
        result = console.main()
        print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
        return 0
    if args.name == "litellm":  # remote chat and embeddings: our API beside LiteLLM's proxy
        result = litellm.main()
        print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
        return 0 if result.get("run", True) else 1
    if args.name == "webhooks":  # one tenant's deliveries from one worker, at two tenant caps
        result = webhooks.main()
        print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
        return 0
    if args.name == "openloop":  # latency at fixed rates, beside direct Triton requests
        result = openloop.main()
        print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=2))
        return 0
    if args.name == "scale":  # Triton replicas and a rolling restart, on servers of its own
        result = scale.main()
        print(json.dumps({k: v for k, v in result.items() if k != "details"}, indent=2))
        return 0
    if args.name == "smoke":
        out = args.out or Path(tempfile.mkdtemp(prefix="overspill-bench-smoke-"))
        result, path = run(ALL, SMOKE, out, latest=True)
    elif args.name == "all":
        result, path = run(ALL, full, args.out or RESULTS_DIR, latest=True)
        if path.parent == RESULTS_DIR:  # scale merges its keys into bench/results/latest.json
            result.update({k: v for k, v in scale.main().items() if k.startswith("scale_")})
    else:
        result, path = run((args.name,), full, args.out or RESULTS_DIR, latest=False)
    print_ratios(result, path)
    if args.name == "all":
        print(report.generate(path.parent))
    elif args.name == "smoke":
        print(report.generate(path.parent, path.parent / "docs"))  # exercised, kept out of docs/
    return 0


if __name__ == "__main__":
    sys.exit(main())
