#!/usr/bin/env bash
# Provision Slurm, MUNGE and Charliecloud binaries for the virtual cluster's Slurm tests (called by `make test` and
# `make slurm`): Debian's slurm-wlm (slurmctld, slurmd and the clients), munge, and for nodekit slurm's charliecloud
# mode charliecloud-runtime (ch-run), squashfs-tools (mksquashfs) and squashfuse (ch-run mounts SquashFS images).
#
# Not the `charliecloud` metapackage: its charliecloud-builders (ch-convert, ch-image) depends on Debian's docker.io
# 20.10, which would put a second dockerd on PATH and create /etc/docker/key.json (every new engine the same ID).
# nodekit makes the SquashFS itself (docker export and mksquashfs, nodekit/backends/slurm/convert.py).
#
# The tests start munged, slurmctld and one slurmd per host namespace themselves (tests/cluster/slurm.py, their own
# config, key, spool and pid files); this script only installs the binaries. It never starts, stops or enables a
# system service: Debian's maintainer scripts are kept from starting munge or slurm with a policy-rc.d that refuses
# (exit 101) for the duration of the install, unless the machine already has its own policy.
set -euo pipefail

packages=(slurm-wlm munge charliecloud-runtime squashfs-tools squashfuse)
have() {
    for tool in slurmctld slurmd sbatch srun squeue scontrol scancel munged mungekey ch-run mksquashfs squashfuse; do
        command -v "$tool" >/dev/null || return 1
    done
}
if have; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "slurm.sh: Slurm or Charliecloud is missing; install Debian's ${packages[*]} (needs root and apt)" >&2
    exit 1
fi
bash "$(dirname "$0")/apt-install.sh" "${packages[@]}"
have
