"""Where a planned job runs: ``compose/`` (one node by hand), ``fleet/`` (every node from the head over SSH),
``slurm/``, ``k8s/``. Each renders the same per-rank plan."""
