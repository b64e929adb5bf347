"""Real processes for the tests, the benchmarks and the demo (dev only: not in the wheel).

`reverb_workload.py`: a small real Reverb server with insert/sample loops (run as a script).
`procs`: spawn a child in its own session, read its announce line, kill its whole group;
free ports; HTTP GETs with timeouts; polling. `agent`: `python -m agents.run` as a child,
its JSON event lines read as they arrive. `ray_cluster`: a multi-node Ray cluster on loopback
(Ray's `cluster_utils.Cluster`), one warm per test module. Run from the repository root, which is
on sys.path.
"""
