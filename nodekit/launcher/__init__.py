"""nodekit's in-container launcher: ``python -m nodekit.launcher train.py [args]`` or ``... -m pkg.mod [args]``.

Runs as the image's ENTRYPOINT on every node. Standard library plus torch (imported by preflight, then used by
torchrun and the peer watchdog). It turns the node's environment into the launch:

1. parse the environment (below) into a frozen ``LaunchConfig``; print one start line;
2. check that the training script is in the working directory (/workspace);
3. preflight (unless NODEKIT_PREFLIGHT=0 or NNODES=1): every node publishes its stack facts to node 0 over
   nodekit's store on MASTER_ADDR:NODEKIT_PREFLIGHT_PORT (``store.py``; it admits only holders of the job secret,
   and workers check main holds it too); node 0 compares them and every node prints the same report;
   nodes that never arrive within NODEKIT_RDZV_TIMEOUT are named instead of everyone hanging;
4. mode ``torchrun`` after a preflight: run torchrun in this process (torch is already imported) with the peer
   watchdog (``watchdog.py``): node 0 keeps hosting the preflight store, every node bumps a heartbeat counter there
   every second and watches the others'. A node whose counter stands still for NODEKIT_PEER_TIMEOUT, or a main
   whose store stops answering that long, is *lost*: every other node prints one line naming it (rank, address,
   host), stops its torchrun (SIGTERM to itself, which torchrun turns into stopping its workers) and exits 19. A
   node whose torchrun failed marks itself done with its code and the worker torchrun gave up on, and the others
   stop with "node k failed: worker rank R (local rank L) was killed by SIGKILL; ..." instead. A node that ended
   normally marks itself done too, so no one is reported for leaving. The same channel carries the stall watch:
   every node publishes its ranks' progress, and when no rank progressed for NODEKIT_STALL_TIMEOUT main prints
   every rank's stack grouped by where it waits (``stacks/``) and every node stops (exit 22) or only warns. With
   NODEKIT_MAX_RESTARTS > 0 torchrun uses the c10d rendezvous (node 0 hosting it on MASTER_PORT, main's run id
   from the verdict), so that a worker that dies on any node restarts the workers of every node; the launcher keeps
   beating meanwhile (``plan.py``);
5. otherwise exec ``torchrun`` (mode ``torchrun`` without preflight) or ``python <command>`` (mode ``env``, which
   has no watchdog) in place of itself, so the job's exit code is the container's.

Environment (set by nodekit's compose file, see ``nodekit/job/env.py``):

=================================  ========  ====================================================================
MASTER_ADDR                        required  main's IP address (not a name, unless NODEKIT_RESOLVE_MAIN=1)
NODEKIT_RESOLVE_MAIN               0         1: MASTER_ADDR is a DNS name (pod 0's, in Kubernetes), resolved on the
                                             node, retried until NODEKIT_RDZV_TIMEOUT (netfacts.py)
MASTER_PORT                        required  torchrun's rendezvous port on main, 1..65535
NODE_RANK                          required  0..NNODES-1
NNODES                             required  >= 1
NPROC_PER_NODE                     required  integer >= 1 (the host resolves ``auto``)
WORLD_SIZE                         optional  total processes when fixed; informational and compared across nodes
NODEKIT_NAME                       ""        job name, shown and compared
NODEKIT_LAUNCHER                   torchrun  ``torchrun``, ``fabric``, ``env``, ``torch.distributed.launch``, ``mpirun``
NODEKIT_ACCELERATOR / _STRATEGY /  cpu, ddp  mode fabric: LT_ACCELERATOR, LT_STRATEGY, LT_PRECISION (plan.fabric_env)
  _PRECISION
NODEKIT_NPROC_DECLARED             unset     ``0:2,1:auto``: per-node processes nodekit.toml declares (preflight)
NODEKIT_GPUS_DECLARED              unset     ``0:4,1:2``: per-node GPUs nodekit.toml declares (preflight)
NODEKIT_DATA_CHECK                 unset     ``/data:sizes,/ref:hashes``: mounts compared across nodes (samedata.py)
NODEKIT_EXIT_GUARD                 1         the job's processes load exitguard.py (which also arms the stack dump
                                             and progress record of stacks/hook.py); 0 switches both off
NODEKIT_STALL_TIMEOUT              300       seconds without progress of any rank (no collective issued, no main
                                             thread moved) before main prints every rank's stack grouped by place;
                                             0: no stall watch, else at least 5 (watchdog/stall.py)
NODEKIT_STALL_ACTION               stop      ``stop``: then every node stops its job and exits 20; ``warn``: only print
NODEKIT_WORKER_DIR                 /tmp/...  where each job process keeps its stack dump and progress
                                             (/tmp/nodekit-workers; ``python -m nodekit.launcher.stacks`` reads it)
NODEKIT_MAX_RESTARTS               0         torchrun --max-restarts; > 0: c10d rendezvous (nothing in mode env)
NODEKIT_RDZV_TIMEOUT               180       seconds to wait for every node (preflight, and torchrun's rendezvous)
NODEKIT_PEER_TIMEOUT               15        seconds without a node's heartbeat before it is lost; 0: no watchdog,
                                             else at least 3 (nodes beat once a second)
NODEKIT_PREFLIGHT                  1         0 skips preflight
NODEKIT_GPU_HEALTH                 warn      GPU health (checks.py): warn, refuse (exit 21) or off
NODEKIT_DCGM                       1         0: no ``dcgmi diag -r 1`` even where DCGM is installed
NODEKIT_LINK_CHECK                 warn      link check after preflight (linkcheck/): warn (beside the job's start
                                             when no floor is set: checks.LinksBeside), refuse (exit 20, before any
                                             worker) or off
NODEKIT_MIN_LINK_GBIT              unset     a pair below this many Gbit/s refuses (exit 20)
NODEKIT_LINK_SECONDS               0.2       bulk transfer per pair and direction, 0.05..5
NODEKIT_CHECKS_ONLY                0         1: preflight and the checks, then exit (``nodekit doctor --fleet``)
NODEKIT_PREFLIGHT_PORT             PORT+1    preflight store port on main; must differ from MASTER_PORT
NODEKIT_OUTPUT_DIR                 /outputs  for the training script; the launcher only passes it on
NODEKIT_FINGERPRINT                ""        the image's stack fingerprint (baked into the image as ENV)
NODEKIT_IMAGE_ID                   ""        the image's identity (one value on either image store), from the host
NODEKIT_ALLOW_HETEROGENEOUS_GPUS   0         1: GPU model/count and processes per node may differ (notes)
GLOO_SOCKET_IFNAME / NCCL_...      unset     the interface toward main; shown in the start line
=================================  ========  ====================================================================

Mode ``mpirun`` (scripts written for ``mpirun -np N -x MASTER_ADDR -x MASTER_PORT python main.py``): the launcher
starts NPROC_PER_NODE processes of the command itself, each with OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK,
_LOCAL_SIZE and _NODE_RANK as ``-map-by slot`` lays them out (``ranks.py``), under the peer watchdog; no MPI runtime.

Mode ``env`` (Lightning ``Trainer(num_nodes=NNODES, devices=NPROC_PER_NODE)``, LightlyTrain): the command runs as
one process per node and the framework starts its own per-device workers. Lightning's LightningEnvironment reads
MASTER_ADDR, MASTER_PORT and NODE_RANK; LOCAL_RANK, RANK, GROUP_RANK and LOCAL_WORLD_SIZE are removed, because a
set LOCAL_RANK tells Lightning that someone else already started every worker (it would then start none and hang),
and all four together select TorchElasticEnvironment.

Exit codes: 0 the job succeeded; 2 bad environment or command (missing variable, script not found, torchrun
missing); 17 stack or launch mismatch between nodes, or a node rank claimed twice; 18 rendezvous failed: a node
never arrived within NODEKIT_RDZV_TIMEOUT, main unreachable, main lost, or the preflight port taken; 19 another
node was lost (no heartbeat for NODEKIT_PEER_TIMEOUT, or main's store unreachable that long) or failed, and this
node stopped its own part of the job: the line before the exit names the node (also when this node's own job had
already failed through gloo/NCCL, where the lost node, or the node whose worker failed first, is the cause); 20 the
link check refused (a pair could not connect, is below NODEKIT_MIN_LINK_GBIT, or with refuse is far below the
others); 21 the GPU health check refused (refuse, and a sick GPU on some node); 22 no rank made progress for
NODEKIT_STALL_TIMEOUT (NODEKIT_STALL_ACTION=stop): the lines before name where each rank waits; 143
terminated during preflight, or while waiting for the other nodes after torchrun; anything else is the job's own
code (torchrun's, in torchrun mode).

The exit codes' names and values, and the other values the host side must agree on, are in ``contract.py``;
the host side imports them from there.
"""
