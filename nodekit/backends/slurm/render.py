"""The sbatch script of a :class:`~nodekit.backends.slurm.job.SlurmJob` (pure: a job in, the script's text out).

The script is self-contained (``sbatch`` it by hand and it does what ``nodekit slurm --submit`` does):

1. ``#SBATCH``: N nodes, one task per node, GPUs per node, partition, account, time, the log, no requeue, and
   ``--no-kill`` (a dead node must not end the job before the survivors have named it);
2. the batch shell resolves main, the first host of ``scontrol show hostnames "$SLURM_JOB_NODELIST"``, to its
   address (the launcher takes an IP address);
3. a first ``srun`` step only checks every node (its tool, the image there; docker and charliecloud): a node that
   lacks either ends the job with exit 2, named, before any container starts anywhere;
4. ``srun --wait`` starts one task per node; the task's body travels as arguments (a quoted here-document, so
   nothing in it is expanded by the batch shell, cut into pieces that a fixed first argument joins and runs:
   :data:`TASK_BOOT`) and reads its rank from ``SLURM_NODEID`` (in the batch shell that is always 0). It runs the
   node's container in the background and waits, so that a signal (``scancel``) reaches its trap at once: in docker
   mode the trap stops and removes the container, which the killed docker CLI would leave running; then it prints
   ``nodekit-slurm: node R (HOST) exited with code C``;
5. every line of the tasks passes through a small awk program (line by line: mawk is told so) that prints it and,
   at the end, decides the job's exit code from the tasks' reports (tagged with the job's report token, which the
   job's own output cannot forge): the first node that failed with its own code (not 0, not 19: a node the
   watchdog stopped because another was lost or failed), else 19, else 0. The script exits with it, so Slurm's
   ExitCode and ``nodekit slurm --submit`` give the failing node's code.
"""

from __future__ import annotations

import dataclasses

from nodekit import __version__
from nodekit.backends.slurm.job import SlurmJob, sbatch_options
from nodekit.backends.slurm.modes import JOB_LABEL, charliecloud_task, container_name, pyxis_options, rank_block
from nodekit.backends.slurm.shell import quote, word
from nodekit.job.container import ContainerSpec
from nodekit.launcher.contract import EXIT_PEER_LOST, Env

# docker stop's grace in the task's trap: below Slurm's default KillWait (30 s), after which Slurm SIGKILLs the task
# (and the trap with it).
STOP_GRACE_S = 15
# srun --wait: how long the other tasks may run on after the first one ended. The launchers end together (a failed
# node's peers stop within seconds, torchrun giving its workers 30 s); a task still running after that is on a node
# that died, which srun would otherwise wait for until Slurm declares the node down (SlurmdTimeout, 300 s by
# default). srun then terminates the step and waits KillWait (30 s) for it.
WAIT_S = 60
TASK_END = "NODEKIT_TASK"
# Linux bounds each argument of a process to 128 KiB (MAX_ARG_STRLEN), and the task's body grows with the nodes (191 kB
# at 10,000 with per-node GPUs: "srun: Argument list too long"). It reaches srun and bash as pieces of at most PIECE
# characters (4 bytes each at most, in UTF-8), after main's address and "check" or "": TASK_BOOT joins them and runs
# the body with those two as $1 and $2, as `bash -c BODY nodekit-task ADDR [check]` would.
PIECE = 16384
TASK_BOOT = 'nk_a=$1 nk_c=$2; shift 2; printf -v nk_body %s "$@"; set -- "$nk_a" "$nk_c"; eval "$nk_body"'
VERDICT_END = "NODEKIT_VERDICT"

REPORT_TOKEN = "NODEKIT_REPORT_TOKEN"
"""The variable that carries the job's report token from the batch shell to every task (as the secret travels)."""

# A task's report is tagged with the job's report token: the verdict counts only a tagged line whose srun label is
# the rank it reports, so no line of the job's own output (which may print anything, a dataset's text included)
# decides the job's exit code or whom it blames. The tag is searched in the line, not only at its start: a job's
# last output without a newline shares its line with the report (that part is printed as a line of its own). The
# token is never printed, nor an argument of any process (awk reads it from its environment).
VERDICT = r"""BEGIN { TOKEN = ENVIRON["NODEKIT_REPORT_TOKEN"] }
{
    line = $0; at = 0
    if (TOKEN != "" && match(line, /^ *[0-9]+: /)) {
        label = substr(line, 1, RLENGTH); body = substr(line, RLENGTH + 1)
        at = index(body, TOKEN " nodekit-slurm: node ")
    }
    if (at > 0) {
        if (at > 1) print label substr(body, 1, at - 1)
        report = substr(body, at + length(TOKEN) + 1); line = label report
        task = label; gsub(/[^0-9]/, "", task)
        rank = report; sub(/^nodekit-slurm: node /, "", rank); sub(/ .*$/, "", rank)
        if (report !~ /^nodekit-slurm: node [0-9]+ \(.*\) exited with code [0-9]+$/ || rank + 0 != task + 0) at = 0
    }
    print line; fflush()
    if (at > 0) {
        host = report; sub(/^nodekit-slurm: node [0-9]+ \(/, "", host); sub(/\) exited with code [0-9]+$/, "", host)
        code = report; sub(/^.* exited with code /, "", code)
        reported++
        if (code != 0 && code != LOST && first == "") { first = code; first_node = "node " rank " (" host ")" }
        if (code == LOST && lost == "") lost = code
    }
}
END {
    if (first != "") {
        printf "nodekit-slurm: the job failed with exit code %s: %s failed first\n", first, first_node
        exit first
    }
    if (lost != "") {
        printf "nodekit-slurm: the job ended with exit code %s: a node was lost or failed (named above)\n", lost
        exit lost
    }
    if (reported < NNODES) {
        printf "nodekit-slurm: %d of %d nodes reported their exit code\n", reported, NNODES
        exit 0
    }
    print "nodekit-slurm: every node finished (exit code 0)"
}"""


def sbatch_lines(job: SlurmJob) -> list[str]:
    """The ``#SBATCH`` lines, each value quoted for sbatch's own parser, which reads them without a shell
    (:func:`nodekit.backends.slurm.job.sbatch_value`)."""
    return [f"#SBATCH {o}" for o in sbatch_options(job.sbatch)]


def _secret(job: SlurmJob) -> list[str]:
    """The job secret in the batch shell's environment, which srun hands to every task: no process ever has it in
    its arguments (every user of a node can read those), and this script, which holds it, is written 0600."""
    if not job.job_secret:
        return []
    return [
        "# The job secret, for every task's environment (srun passes it on); never an argument of any process.",
        f"export {Env.JOB_SECRET}={quote(job.job_secret)}",
    ]


def _report_token(job: SlurmJob) -> list[str]:
    if not job.report_token:
        raise ValueError("a Slurm job's script needs its report token (plan_job's report_token)")
    return [
        "# The token that tags each task's exit-code report, which the verdict below reads (never printed).",
        f"export {REPORT_TOKEN}={quote(job.report_token)}",
    ]


def render(job: SlurmJob) -> str:
    """The script's text."""
    header = [
        "#!/bin/bash",
        f"# Generated by nodekit {__version__}: {job.name} on {job.sbatch.nodes} Slurm node(s), one task per node, "
        f"container mode {job.mode}.",
        "# Submit it with `sbatch <this file>`; `nodekit slurm --submit` submits it and follows the job.",
        *sbatch_lines(job),
        "set -euo pipefail",
        *_secret(job),
        *_report_token(job),
        "",
        "# Main is the first host of the allocation; the launcher takes its address (not a loopback one).",
        "# (awk reads to the end: an early exit would kill the writer with SIGPIPE, which pipefail reports.)",
        "nk_main=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | awk 'NR == 1')",
        "nk_main_addr=$(getent ahostsv4 \"$nk_main\" | awk '$1 !~ /^127\\./ && !n++ { print $1 }')",
        'if [ -z "$nk_main_addr" ]; then',
        '    echo "nodekit-slurm: main node $nk_main has no IPv4 address other than loopback (getent ahostsv4 '
        '$nk_main)" >&2',
        "    exit 2",
        "fi",
        f"mkdir -p {quote(job.output_dir)}",
        "",
        f"IFS= read -r -d '' nk_task <<'{TASK_END}' || true",
        task_body(job),
        TASK_END,
        f"nk_parts=(); for ((nk_i = 0; nk_i < ${{#nk_task}}; nk_i += {PIECE})); do "
        f'nk_parts+=("${{nk_task:nk_i:{PIECE}}}"); done',
        f"IFS= read -r -d '' nk_verdict <<'{VERDICT_END}' || true",
        VERDICT,
        VERDICT_END,
        "",
        "# mawk (Debian's awk) reads a pipe a block at a time unless told otherwise: the log would lag the job.",
        "nk_awk=(awk)",
        'case "$(awk -W version 2>&1)" in *mawk*) nk_awk=(awk -W interactive) ;; esac',
        "nk_code=0",
        *_check_step(job),
        f"{srun_line(job)} 2>&1 \\",
        f'    | "${{nk_awk[@]}}" -v NNODES={job.sbatch.nodes} -v LOST={EXIT_PEER_LOST} "$nk_verdict" || nk_code=$?',
        'exit "$nk_code"',
    ]
    return "\n".join(header) + "\n"


def srun_line(job: SlurmJob, *, check: bool = False) -> str:
    opts = [f"--nodes={job.sbatch.nodes}", "--ntasks-per-node=1", "--label", "--kill-on-bad-exit=0"]
    if not check:
        opts.append(f"--wait={WAIT_S}")
    if job.mode == "pyxis":
        opts += pyxis_options(job)
    cpus = '${SLURM_CPUS_PER_TASK:+--cpus-per-task="$SLURM_CPUS_PER_TASK"}'
    mode = "check" if check else '""'
    task = f'bash -c {quote(TASK_BOOT)} nodekit-task "$nk_main_addr" {mode} "${{nk_parts[@]}}"'
    return f"srun {' '.join(opts)} {cpus} {task}"


def _check_step(job: SlurmJob) -> list[str]:
    """A first step that only checks every node (its tool, the image there): a node that lacks either ends the
    job before any container starts anywhere, instead of the others waiting for it until the rendezvous timeout.
    (pyxis: the task runs inside the container, and pyxis itself names a node that cannot start it.)"""
    if job.mode == "pyxis":
        return []
    return [
        "# Every node first checks that it can run its part; nothing starts unless all can.",
        f"{srun_line(job, check=True)} || nk_code=$?",
        'if [ "$nk_code" != 0 ]; then',
        '    echo "nodekit-slurm: the nodes\' check failed (exit code $nk_code): nothing was started"',
        '    exit "$nk_code"',
        "fi",
    ]


def task_body(job: SlurmJob) -> str:
    """The script every task runs (by :data:`TASK_BOOT`, in ``bash -c``), in the node's shell (docker, charliecloud)
    or in the container (pyxis). ``$1`` is main's address."""
    lines = [
        "# One task per node: rank from SLURM_NODEID, main's address in $1.",
        "nk_rank=$SLURM_NODEID",
        "nk_main_addr=$1",
        "nk_host=${SLURMD_NODENAME:-$(hostname)}",
        "# The report's tag (the verdict reads the job step's reports only); no process this task starts inherits it.",
        f"nk_tag=${{{REPORT_TOKEN}:-}}; unset {REPORT_TOKEN}",
        '[ "${2:-}" != check ] || nk_tag=',
        'nk_report() { echo "${nk_tag:+$nk_tag }nodekit-slurm: node $nk_rank ($nk_host) exited with code $1"; '
        'exit "$1"; }',
        'nk_fail() { echo "nodekit: [node $nk_rank on $nk_host] $1. Fix: $2" >&2; nk_report 2; }',
        "# The child's exit code, waiting again when a trapped signal interrupted `wait`.",
        'nk_wait() { local c; while :; do c=0; wait "$1" || c=$?; kill -0 "$1" 2>/dev/null || return "$c"; done; }',
        *_prelude(job),
        '[ "${2:-}" != check ] || exit 0',
        *(charliecloud_task() if job.mode == "charliecloud" else []),
        'case "$nk_rank" in',
    ]
    # A block is the rank's container with the rank a hole (the task's): ranks whose specs differ only in it share one,
    # rendered once (each is O(nodes): the job-wide per-node declarations).
    blocks: dict[ContainerSpec, str] = {}
    groups: dict[str, list[int]] = {}
    for spec in job.nodes:
        key = dataclasses.replace(spec, rank=0)
        if (block := blocks.get(key)) is None:
            block = blocks[key] = rank_block(job, spec, "    ")
        groups.setdefault(block, []).append(spec.rank)
    for block, ranks in groups.items():
        lines += [f"{'|'.join(str(r) for r in ranks)})", block, "    ;;"]
    lines += [
        f'*) nk_fail "no plan for node rank $nk_rank" "write the script again for {job.sbatch.nodes} nodes '
        '(nodekit slurm)" ;;',
        "esac",
        *_launch(job),
        'nk_code=0; nk_wait "$nk_pid" || nk_code=$?',
        'nk_report "$nk_code"',
    ]
    return "\n".join(lines)


# `docker image inspect`'s template for an image's identity in a Slurm task (docker mode): the fields both image stores
# report alike (nodekit.system.docker.models.IDENTITY_KEYS, the layers, the platform), hashed by the task.
IDENTITY_FORMAT = (
    "{{json .RootFS.Layers}} {{json .Config.User}} {{json .Config.Env}} {{json .Config.Entrypoint}} "
    "{{json .Config.Cmd}} {{json .Config.WorkingDir}} {{json .Config.Labels}} {{json .Config.StopSignal}} "
    "{{.Os}}/{{.Architecture}}/{{.Variant}}"
)


def _prelude(job: SlurmJob) -> list[str]:
    if job.mode == "docker":
        engine = f"DOCKER_HOST={quote(job.docker_host)}" if job.docker_host else "-u DOCKER_HOST"
        return [
            "# This node's own engine: not the one of the shell that submitted the job.",
            f"nk_docker=(env -u DOCKER_CONTEXT {engine} docker)",
            f"nk_image={quote(job.image.ref)}",
            f"nk_name={word(container_name(job))}",
            "# (-x: bash's command -v falls back to a file it cannot execute.)",
            'nk_bin=$(command -v docker) && [ -x "$nk_bin" ] || nk_fail "docker is not on PATH" "install Docker on '
            'every node, or choose another [slurm] container"',
            '"${nk_docker[@]}" version --format "{{.Server.Version}}" >/dev/null 2>&1 || nk_fail "this node\'s '
            'Docker engine does not answer (docker version)" "start Docker on every node, or set [slurm] docker_host"',
            "# The image's identity on this node: what both of Docker's image stores report alike (the layers and",
            "# the runtime config), so that nodes on the classic and the containerd store agree (their ids differ).",
            f'nk_image_id=$("${{nk_docker[@]}}" image inspect --format {quote(IDENTITY_FORMAT)} "$nk_image" '
            '2>/dev/null) && nk_image_id="sha256:$(printf %s "$nk_image_id" | sha256sum | cut -d" " -f1)" || nk_fail '
            '"image $nk_image is not in this node\'s Docker engine" "nodekit push it to every node (or set [slurm] '
            'push_to)"',
            "# --ulimit NAME=WANT (bytes, -1: unlimited) within this node's hard limit (what Slurm gave the task); "
            "nothing when unlimited is wanted but not allowed here.",
            'nk_ulimit() { local hard b; hard=$(ulimit -H "$2"); if [ "$hard" = unlimited ]; then b=$3; '
            'elif [ "$3" = -1 ]; then return; else b=$((hard * 1024)); [ "$b" -lt "$3" ] || b=$3; fi; '
            'echo "--ulimit=$1=$b:$b"; }',
            "# The GPUs Slurm gave this task (their host indices), for docker run --gpus.",
            "nk_slurm_gpus=${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}",
            'nk_slurm_gpus=${nk_slurm_gpus:+\\"device=$nk_slurm_gpus\\"}',
            "# scancel: stop the container (the docker CLI dies with the step and would leave it running).",
            f'nk_stop() {{ "${{nk_docker[@]}}" stop --time {STOP_GRACE_S} "$nk_name" >/dev/null 2>&1; '
            '"${nk_docker[@]}" rm -f "$nk_name" >/dev/null 2>&1; }',
            f"# A site epilog can sweep what a SIGKILLed task left: docker rm -f $(docker ps -aq --filter "
            f"label={JOB_LABEL}=$SLURM_JOB_ID)",
        ]
    if job.mode == "charliecloud":
        return [
            f"nk_image={quote(job.image_path)}",
            'nk_chrun=$(command -v ch-run) && [ -x "$nk_chrun" ] || nk_fail "ch-run is not on PATH" "install '
            "Charliecloud on every node (Debian: apt-get install charliecloud-runtime squashfuse), or choose another "
            '[slurm] container"',
            '[ -r "$nk_image" ] || nk_fail "image $nk_image cannot be read on this node" "set [slurm] image_dir to a '
            'path every node mounts"',
        ]
    return []


def _launch(job: SlurmJob) -> list[str]:
    if job.mode == "docker":
        return [
            "trap nk_stop TERM INT HUP",
            '"${nk_docker[@]}" run "${nk_run[@]}" &',
            "nk_pid=$!",
        ]
    return [
        *(['nk_env+=("USER=${USER:-$(id -un)}")  # ch-run needs it; --unset-env drops it inside'] if job.mode ==
          "charliecloud" else []),
        "# Exactly the container's environment, as Docker would give it: nk_env, and nk_pass's names from the task's",
        "# own (the job secret, pass_env). Set by the shell's builtins, so no value is an argument of any process.",
        "nk_exec() {",
        "    local nk_v nk_keep=()",
        '    for nk_v in "${nk_pass[@]}"; do [ -z "${!nk_v+x}" ] || nk_keep+=("$nk_v=${!nk_v}"); done',
        '    for nk_v in $(compgen -e); do unset "$nk_v" 2>/dev/null || true; done',
        '    export -- "${nk_env[@]}" "${nk_keep[@]}"',
        '    exec "${nk_run[@]}"',
        "}",
        "nk_exec &",
        "nk_pid=$!",
    ]  # fmt: skip
