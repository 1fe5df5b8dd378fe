"""Benchmarks: overspill against its limits, side by side, in one run on one machine.

Every comparison starts its own redis-server, tritonserver and worker processes on free
loopback ports (see :mod:`bench.harness`), measures overspill and the direct baseline against
the same Triton, and records ratios. ``python -m bench all`` writes ``bench/results/``;
``python -m bench report`` turns ``latest.json`` into ``docs/benchmarks.md``.
"""
