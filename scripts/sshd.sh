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
bash "$(dirname "$0")/apt-install.sh" openssh-server openssh-client
test -x /usr/sbin/sshd
