"""A Slurm-shaped stage for running a rendered sbatch script without Slurm: fake ``scontrol``, ``getent`` and
``srun`` (one task per node, in parallel, lines labelled ``R: `` as ``srun --label`` does) and a fake ``docker`` or
``ch-run`` that records exactly what it was given (argv and environment, NUL-separated) and exits with the code the
test asks for (``FAKE_EXIT_<rank>``), having printed ``FAKE_SAY_<rank>`` last."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SRUN = r"""#!/bin/bash
# srun --label ... bash -c TASK NAME ARG...: the task on every node, in parallel; the highest exit code.
set -o pipefail
while [ "$1" != bash ]; do shift; done
n=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | wc -l)
pids=()
for ((id = 0; id < n; id++)); do
    ( export SLURM_NODEID=$id SLURMD_NODENAME=n$((id + 1)) FAKE_RANK=$id; "$@" 2>&1 | sed -u "s/^/$id: /" ) &
    pids+=($!)
done
code=0
for p in "${pids[@]}"; do wait "$p" || { c=$?; [ "$c" -gt "$code" ] && code=$c; }; done
exit "$code"
"""
SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] || exit 1
for i in $(seq 1 "${FAKE_NODES:-2}"); do echo "n$i"; done
"""
GETENT = """#!/bin/bash
echo "10.9.0.1      STREAM $2"
"""
RECORDER = r"""#!/bin/bash
# Records argv and environment of one call, NUL-separated, then exits with FAKE_EXIT_<rank>. (ch-run runs under
# env -i: the directory is written in here, the rank is the container's NODE_RANK.)
FAKE_DIR=@DIR@
FAKE_RANK=${FAKE_RANK:-$NODE_RANK}
if [ "$(basename "$0")" = docker ] && [ "$1" = image ]; then echo "sha256:node$FAKE_RANK"; exit 0; fi
if [ "$(basename "$0")" = docker ] && [ "$1" = version ]; then echo "29.0.0"; exit 0; fi
if [ "$(basename "$0")" = docker ] && [ "$1" != run ]; then echo "$*" >> "$FAKE_DIR/docker-other-$FAKE_RANK"; exit 0; fi
printf '%s\0' "$@" > "$FAKE_DIR/argv-$FAKE_RANK"
# ch-run: what its SquashFS mount point and image storage are while it runs (mode, owner, entries).
for a in "$@"; do
    [ "$(basename "$0")" = ch-run ] || break
    case "$a" in --mount=*) d=${a#*=}; echo "mount $(stat -c '%a %U' "$d") $(ls -A "$d" | tr '\n' ' ')" \
        >> "$FAKE_DIR/dirs-$FAKE_RANK" ;; esac
done
if [ -n "${CH_IMAGE_STORAGE:-}" ]; then
    d=$CH_IMAGE_STORAGE; echo "storage $(stat -c '%a %U' "$d") $(ls -A "$d" | tr '\n' ' ')" \
        >> "$FAKE_DIR/dirs-$FAKE_RANK"
fi
env -0 > "$FAKE_DIR/env-$FAKE_RANK"
echo "training on node $FAKE_RANK"
# With FAKE_GATE, the job goes on only once that file exists (the test has seen the first line by then).
if [ -n "${FAKE_GATE:-}" ]; then
    while [ ! -e "$FAKE_GATE" ]; do sleep 0.05; done
    echo "still training on node $FAKE_RANK"
fi
# FAKE_SAY_<rank>: what the job prints last (printf %b: "\n" ends a line; without one the line is left open).
say_var=FAKE_SAY_$FAKE_RANK
[ -z "${!say_var:-}" ] || printf '%b' "${!say_var}"
code_var=FAKE_EXIT_$FAKE_RANK
exit "${!code_var:-0}"
"""


def stage(d: Path, *tools: str) -> dict[str, str]:
    """A bin directory with the fakes (and ``tools``: docker, ch-run), and the environment to run a script in."""
    bin_dir = d / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in {"srun": SRUN, "scontrol": SCONTROL, "getent": GETENT}.items():
        (bin_dir / name).write_text(text)
    for tool in tools:
        (bin_dir / tool).write_text(RECORDER.replace("@DIR@", str(d)))
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_JOB_ID": "42",
        "FAKE_DIR": str(d),
        "HOME": str(d),
    }


def run_script(script: str, env: dict[str, str], d: Path) -> subprocess.CompletedProcess[str]:
    path = d / "job.sbatch"
    path.write_text(script)
    return subprocess.run(["bash", str(path)], env=env, capture_output=True, text=True, timeout=60, cwd=d)


def recorded(d: Path, what: str, rank: int) -> list[str]:
    data = (d / f"{what}-{rank}").read_bytes()
    return [part.decode() for part in data.split(b"\0")[:-1]]


def environ(d: Path, rank: int) -> dict[str, str]:
    return dict(item.split("=", 1) for item in recorded(d, "env", rank))


def outside(env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **env}
