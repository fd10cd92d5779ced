#!/usr/bin/env bash
# Install Debian packages (root and apt) without starting, enabling or restarting any service they ship: a
# policy-rc.d that refuses every start (exit 101) for the duration of the install, unless the machine already has
# its own policy. Used by sshd.sh and slurm.sh, which only want the binaries. Usage: apt-install.sh PKG...
set -euo pipefail

policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends "$@" >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends "$@" >/dev/null; }
