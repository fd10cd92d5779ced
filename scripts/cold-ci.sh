#!/usr/bin/env bash
# The closest this machine gets to a newly provisioned one, then a fresh clone's .ci/run, timed (issue 44's check:
# `make test` on a machine with none of the suite's images and caches). Destructive: every container and image of
# both engines, both build caches, the virtual hosts' data roots, the wheel and blob cache and Charliecloud's image
# cache go; the engines' Debian packages stay installed, as on any provisioned machine.
#
#   bash scripts/cold-ci.sh --remove-everything [REF] [OUT]
#
# REF: the commit to clone (default HEAD); OUT: the clone's path (default /tmp/nodekit-cold); the run's output goes
# to OUT.log, its per-test times to OUT.times (NODEKIT_TEST_TIMES; python -m tests.times reads them), and
# "rc=... seconds=..." to OUT.done. COLD_CMD runs another command in the clone instead (COLD_CMD="make demo": the
# README's first command on a cleaned machine). Run it alone: under `flock /tmp/nodekit-heavy.lock` when others
# share the machine.
set -u
# One function, parsed whole before it runs: an edit to this file during a run cannot change what the run does.
main() {
  [ "${1:-}" = "--remove-everything" ] || { echo "cold-ci: this removes every image and cache of both engines; say --remove-everything" >&2; return 2; }
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  ref=$(git -C "$repo" rev-parse "${2:-HEAD}") || exit 2
  out=${3:-/tmp/nodekit-cold}
  echo "cold-ci: cleaning at $(date -u +%T)"
  # Both engines up first: an engine that is down would keep its images through the cleaning, and the run would be warm.
  make -C "$repo" engine engine-containerd > /dev/null || { echo "cold-ci: the engines did not start (make engine)" >&2; exit 1; }
  for h in unix:///var/run/docker.sock unix:///run/nodekit-engine-sid/containerd/docker.sock; do
    docker -H "$h" info > /dev/null 2>&1 || { echo "cold-ci: no engine answers on $h" >&2; exit 1; }
    docker -H "$h" ps -aq | xargs -r docker -H "$h" rm -f >/dev/null 2>&1
    docker -H "$h" images -q | xargs -r docker -H "$h" rmi -f >/dev/null 2>&1
    docker -H "$h" builder prune -af >/dev/null 2>&1
  done
  rm -rf /var/lib/nodekit-cluster/* /var/cache/nodekit-wheels /var/tmp/nodekit-slurm-ch.* 2>/dev/null
  df -h / | tail -1
  rm -rf "$out" "$out.times" && git clone -q "$repo" "$out" && cd "$out" && git checkout -q "$ref" || exit 1
  git log --oneline -1
  start=$(date +%s)
  CI=true NODEKIT_TEST_TIMES="$out.times" bash -c "${COLD_CMD:-bash .ci/run}" < /dev/null > "$out.log" 2>&1
  rc=$?
  echo "rc=$rc seconds=$(( $(date +%s) - start )) ended=$(date -u +%T)" | tee "$out.done"
  exit $rc
}
main "$@"
exit
