#!/usr/bin/env bash
# Provision an OpenSSH server binary for the virtual cluster's fleet tests (called by `make test`/`make sshd`).
#
# The tests start one sshd per host namespace themselves (tests/cluster/harness.py, own config, keys and port);
# this script only makes sure /usr/sbin/sshd exists. It never starts, stops or enables a system sshd service:
# Debian's maintainer scripts are kept from starting one with a policy-rc.d that refuses (exit 101) for the
# duration of the install, unless the machine already has its own policy.
set -euo pipefail

if [ -x /usr/sbin/sshd ] && command -v ssh >/dev/null && command -v ssh-keygen >/dev/null; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "sshd.sh: /usr/sbin/sshd is missing; install Debian's openssh-server (needs root and apt)" >&2
    exit 1
fi
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    made_policy=1
fi
trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
export DEBIAN_FRONTEND=noninteractive
apt-get install -y --no-install-recommends openssh-server openssh-client >/dev/null \
    || { apt-get update >/dev/null && apt-get install -y --no-install-recommends openssh-server openssh-client >/dev/null; }
test -x /usr/sbin/sshd
