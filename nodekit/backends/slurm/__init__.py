"""``nodekit slurm``: the project's job as a self-contained sbatch script, and (``--submit``) submitted and followed.

- :mod:`~nodekit.backends.slurm.job`: pure. The job, every rank planned as ``nodekit up`` plans a node (the same node
  planning and compose rendering), with main's address and the rank left to the job.
- :mod:`~nodekit.backends.slurm.render` and :mod:`~nodekit.backends.slurm.modes`: pure. The script's text; the
  container of a rank in each container mode (docker, charliecloud, pyxis); :mod:`~nodekit.backends.slurm.shell` quotes
  every value.
- :mod:`~nodekit.backends.slurm.submit`: the side effects. Gather (the image, the job secret), check (the Slurm client,
  what sbatch accepts, the mode's tools), convert or ship the image, submit, follow (state, log, exit code) and cancel.
"""
