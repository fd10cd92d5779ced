"""nodekit's in-container launcher: ``python -m nodekit.launcher train.py [args]`` or ``... -m pkg.mod [args]``.

Runs as the image's ENTRYPOINT on every node, with the standard library and torch only. It turns the node's
environment into the launch (``main.py``):

1. parse the environment into a frozen ``LaunchConfig`` (``config.py``; every variable, its default and meaning:
   docs/reference and ``nodekit/job/env.py``, which writes them) and print one start line (``plan.py``);
2. check that the training command is there (/workspace);
3. preflight (unless NODEKIT_PREFLIGHT=0 or NNODES=1): every node publishes its stack facts to node 0 through
   nodekit's store on MASTER_ADDR:NODEKIT_PREFLIGHT_PORT (``store/``: it admits only holders of the job secret,
   and workers check that main holds it too); node 0 compares them (``preflight/``) and every node prints the same
   report; nodes that never arrive within NODEKIT_RDZV_TIMEOUT are named instead of everyone hanging; then the
   same-data check (``datacheck/``), the link check (``linkcheck/``) and GPU health (``gpuhealth/``), through
   ``checks.py``;
4. run the job in the launch style NODEKIT_LAUNCHER names (``plan.py``'s styles: torchrun in this process,
   ``torchrun.py``; the launcher's own children, ``ranks.py`` for mpirun; or exec), under the peer watchdog
   (``watchdog/``): a node lost or failed is named on every other node within NODEKIT_PEER_TIMEOUT and they stop
   (exit 19); no rank progressing for NODEKIT_STALL_TIMEOUT prints every rank's stack grouped by where it waits
   (``stacks/``) and stops the job (exit 22) or only warns. A stop from outside (``stops.py``) is said as a stop.

Exit codes, and every other value the host side and the launcher agree on (variable names, ports, labels), are in
``contract.py``, which both import; docs/reference/exit-codes.md is generated from it.
"""
