"""The head node runs the whole cluster: ``nodekit run``, and ``status``/``logs``/``down`` on every host.

The same plan as ``nodekit up``, N times: each host's facts are gathered on that host (over the user's own OpenSSH),
the pure planner writes ``compose/node-R.yaml`` per rank, and each file is applied through that host's Docker engine
(``ssh://`` endpoints, through :mod:`nodekit.system.docker`). Nothing is installed on any node.

- :mod:`~nodekit.backends.fleet.hosts`: pure. The host list (``hosts`` in nodekit.toml or a ``--hostfile``), validated.
- :mod:`~nodekit.backends.fleet.remote`: the per-host checks and facts, in parallel, each failure named with its fix.
- :mod:`~nodekit.backends.fleet.supervise`: pure. The supervisor's decision table: who failed first, whom to stop,
  whether to restart.
- :mod:`~nodekit.backends.fleet.plan`: pure. The plan each attempt of ``run`` applies and ``run --dry-run`` prints
  (per rank its compose file and start, the ship plan, the relay chains), from what
  :mod:`~nodekit.backends.fleet.nodes` gathered: the hosts' reports, or (dry run) the head alone.
- :mod:`~nodekit.backends.fleet.run`: carries the plan out: ship, write, start, merged log, gang stop, restarts.
"""
