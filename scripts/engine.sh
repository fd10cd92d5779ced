#!/usr/bin/env bash
# Provision and run a Docker engine for nodekit (called by `make engine`).
#
#   bash scripts/engine.sh [up]     ensure an engine with Compose v2 and Buildx answers (default)
#   bash scripts/engine.sh status   print what answers on the socket; exit 1 if nothing usable
#   bash scripts/engine.sh stop     stop the dockerd this script started (PID from its pidfile)
#   bash scripts/engine.sh env      print the shell exports that point a client at this engine (sid: its CLI too)
#
# Options (for extra daemons, e.g. one per network namespace):
#   --socket PATH      unix socket               (default /var/run/docker.sock)
#   --data-root DIR    dockerd --data-root       (default /var/lib/docker)
#   --exec-root DIR    dockerd --exec-root       (default /var/run/docker)
#   --pidfile FILE     dockerd --pidfile         (default /var/run/nodekit-dockerd.pid)
#   --log FILE         daemon output             (default /var/log/nodekit-dockerd.log)
#   --netns NAME       start dockerd inside /var/run/netns/NAME (nsenter --net, not `ip netns exec`,
#                      which would also remount /sys and break the daemon's view of cgroups)
#   --timeout SECONDS  how long `up` waits for the daemon to answer (default 60)
#   --store STORE      the image store: classic (overlay2 graphdriver, the default) or containerd (Docker's
#                      containerd image store, what Engine 29 uses on fresh installs: the containerd-snapshotter
#                      feature, written to a daemon.json beside the pidfile)
#   The daemon.json beside the pidfile also caps the BuildKit cache: builder.gc keeps $NODEKIT_BUILD_CACHE_KEEP
#   (default 6GB), on either store.
#   --engine ENGINE    which Debian suite's engine: trixie (Engine 26.1, the default) or sid (Engine 28.5,
#                      containerd 2.1, Compose 2.40, Buildx 0.29). Default: $NODEKIT_ENGINE, else trixie. sid lives
#                      apart (prefix /opt/nodekit-engine-sid, cache /var/cache/nodekit-engine-sid) and runs as an
#                      extra daemon: its socket, data root, exec root, pidfile and log default to per-store paths
#                      (/run/nodekit-engine-sid/STORE/docker.sock, /var/lib/nodekit-engine-sid/STORE, ...). In the
#                      root namespace it gets a bridge of its own (nksid-classic 10.213.0.1/24, nksid-ctrd
#                      10.213.1.1/24; made by up, removed by stop) and --iptables=false, unless --netns or a
#                      --bridge/-b after -- is given: never docker0, never --bridge=none (which deletes docker0).
#                      Its clients need sid's docker CLI and plugins: `eval "$(bash scripts/engine.sh --engine sid
#                      [--store S] env)"` sets DOCKER_HOST, PATH and DOCKER_CONFIG. Give status, stop and env the
#                      --store that up had. It never touches the trixie engine, its prefix or its linked plugins.
#   -- ARGS...         passed to dockerd unchanged
#
# Contract: exit 0 only when `docker info`, `docker compose version` (v2) and `docker buildx version` all work
# against the socket. Provisioning needs root on Debian with apt (glibc >= 2.34); anywhere else it prints what
# to install and exits 1. It never stops or replaces an engine it did not start.
#
# Why trixie packages on bookworm: bookworm's docker.io is Engine 20.10 and its docker-compose is v1. trixie's
# docker.io, containerd, docker-compose (a v2 CLI plugin) and docker-buildx only need glibc >= 2.34, so they run
# here unpacked with `dpkg -x`; trixie's runc needs glibc 2.38, so runc (and iptables, tini) come from the
# system's own suite through plain apt-get. The trixie index lives in its own lists directory so the system's
# apt configuration never mixes suites. sid (docker.io 28.5) unpacks the same way; only its runc needs glibc 2.38
# as trixie's does, so bookworm's runc 1.1.5 serves both (docs/engine-notes.md, section 6).
set -euo pipefail

PREFIX=/opt/nodekit-engine
CACHE=/var/cache/nodekit-engine
PLUGIN_DIR=/usr/local/lib/docker/cli-plugins
SIDE_SUITE=trixie
SIDE_PACKAGES=(docker.io containerd docker-compose docker-buildx)
SYSTEM_PACKAGES=(runc iptables tini libsystemd0 libcap2)
MIN_ENGINE_MAJOR=23

# Empty until parse_args: each engine has its own defaults (select_engine).
SOCKET=
DATA_ROOT=
EXEC_ROOT=
PIDFILE=
LOG=
NETNS=
TIMEOUT=60
BUILD_CACHE_KEEP=${NODEKIT_BUILD_CACHE_KEEP:-6GB}
STORE=classic
ENGINE=${NODEKIT_ENGINE:-trixie}
EXTRA_ARGS=()
# sid only: the docker CLI config directory whose config.json names sid's plugin directory (cliPluginsExtraDirs).
CLIENT_CONFIG=
# sid in the root namespace only: the bridge this script makes for it, and the bridge's address.
SID_BRIDGE=
SID_BRIDGE_ADDR=

T0=${EPOCHREALTIME/,/.}
# Progress lines carry the seconds since the script started, so a slow step shows itself.
say() { awk -v now="${EPOCHREALTIME/,/.}" -v t0="$T0" -v msg="$*" 'BEGIN { printf "engine: [%5.1fs] %s\n", now - t0, msg }'; }
die() { printf 'engine: error: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

parse_args() {
    ACTION=up
    while [ $# -gt 0 ]; do
        case "$1" in
            up|stop|status|env) ACTION=$1 ;;
            --socket) SOCKET=${2:?--socket needs a path}; shift ;;
            --data-root) DATA_ROOT=${2:?--data-root needs a directory}; shift ;;
            --exec-root) EXEC_ROOT=${2:?--exec-root needs a directory}; shift ;;
            --pidfile) PIDFILE=${2:?--pidfile needs a path}; shift ;;
            --log) LOG=${2:?--log needs a path}; shift ;;
            --netns) NETNS=${2:?--netns needs a name}; shift ;;
            --timeout) TIMEOUT=${2:?--timeout needs seconds}; shift ;;
            --store) STORE=${2:?--store needs classic or containerd}; shift
                     case "$STORE" in classic|containerd) ;; *) die "--store is classic or containerd, not '$STORE'" ;; esac ;;
            --engine) ENGINE=${2:?--engine needs trixie or sid}; shift ;;
            -h|--help) usage; exit 0 ;;
            --) shift; EXTRA_ARGS=("$@"); break ;;
            *) die "unknown argument '$1' (try --help)" ;;
        esac
        shift
    done
    select_engine
    export DOCKER_HOST="unix://$SOCKET"
}

select_engine() {
    case "$ENGINE" in
        trixie)
            SOCKET=${SOCKET:-/var/run/docker.sock}
            DATA_ROOT=${DATA_ROOT:-/var/lib/docker}
            EXEC_ROOT=${EXEC_ROOT:-/var/run/docker}
            PIDFILE=${PIDFILE:-/var/run/nodekit-dockerd.pid}
            LOG=${LOG:-/var/log/nodekit-dockerd.log}
            ;;
        sid)
            PREFIX=/opt/nodekit-engine-sid
            CACHE=/var/cache/nodekit-engine-sid
            SIDE_SUITE=sid
            # Always sid's own client: the CLI on PATH may be older than the engine, and the plugins must be sid's.
            SIDE_PACKAGES+=(docker-cli)
            local run="/run/nodekit-engine-sid/$STORE"
            SOCKET=${SOCKET:-$run/docker.sock}
            DATA_ROOT=${DATA_ROOT:-/var/lib/nodekit-engine-sid/$STORE}
            EXEC_ROOT=${EXEC_ROOT:-$run/exec}
            PIDFILE=${PIDFILE:-$run/dockerd.pid}
            LOG=${LOG:-/var/log/nodekit-engine-sid-$STORE.log}
            CLIENT_CONFIG="$CACHE/client"
            # A second daemon in the root namespace must not share docker0 and the DOCKER iptables chains with the
            # main engine (both would hand out 172.17.0.0/16 and rewrite each other's rules), and must not run with
            # --bridge=none either: dockerd then deletes docker0 at start (moby's removeDefaultBridgeInterface),
            # under the main engine. So it gets a bridge of its own, which dockerd requires to exist already.
            if [ -z "$NETNS" ] && [[ " ${EXTRA_ARGS[*]} " != *" --bridge"* ]] && [[ " ${EXTRA_ARGS[*]} " != *" -b "* ]]; then
                case "$STORE" in
                    classic) SID_BRIDGE=nksid-classic SID_BRIDGE_ADDR=10.213.0.1/24 ;;
                    containerd) SID_BRIDGE=nksid-ctrd SID_BRIDGE_ADDR=10.213.1.1/24 ;;
                esac
                EXTRA_ARGS+=(--bridge "$SID_BRIDGE" --iptables=false)
            fi
            export PATH="$PREFIX/usr/bin:$PATH" DOCKER_CONFIG="$CLIENT_CONFIG"
            ;;
        *) die "--engine is trixie or sid, not '$ENGINE'" ;;
    esac
}

# --- checks (fast, no side effects) ------------------------------------------------------------------------

server_version() {
    local v
    v=$(docker version --format '{{.Server.Version}}' 2>/dev/null) && [ -n "$v" ] && echo "$v"
}
compose_version() { docker compose version --short 2>/dev/null; }
buildx_version() { docker buildx version 2>/dev/null | awk '{print $2; exit}'; }

# The engine version the unpacked docker.io reports (sid: "28.5.2+dfsg4"), or nothing before it is unpacked.
packaged_version() {
    [ -x "$PREFIX/usr/sbin/dockerd" ] || return 1
    "$PREFIX/usr/sbin/dockerd" --version 2>/dev/null | sed -n 's/^Docker version \([^,]*\),.*/\1/p'
}

# sid's client is its own docker CLI with the plugin directory its config names; any other is not sid's engine.
sid_client_ready() {
    [ "$(command -v docker)" = "$PREFIX/usr/bin/docker" ] && [ -f "$CLIENT_CONFIG/config.json" ]
}

# Prints "engine X, compose Y, buildx Z" and returns 0 only if all three are usable.
check_all() {
    local engine compose buildx
    command -v docker >/dev/null 2>&1 || return 1
    if [ "$ENGINE" = sid ]; then sid_client_ready || return 1; fi
    engine=$(server_version) || return 1
    [ "${engine%%.*}" -ge "$MIN_ENGINE_MAJOR" ] 2>/dev/null || return 1
    # Another engine on sid's socket (a trixie daemon an earlier command left there) is not sid's engine.
    if [ "$ENGINE" = sid ]; then [ "$engine" = "$(packaged_version)" ] || return 1; fi
    compose=$(compose_version) || return 1
    case "$compose" in v2.*|2.*) ;; *) return 1 ;; esac
    buildx=$(buildx_version) || return 1
    [ -n "$buildx" ] || return 1
    echo "engine $engine, compose $compose, buildx $buildx on $SOCKET"
}

# A live dockerd. Zombies count as dead: PID 1 here (and in many containers) reaps late, so a killed
# daemon can sit in /proc as "dockerd" in state Z for a long time.
is_dockerd() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ "$stat" == "$1 (dockerd) "* ]] || return 1
    [[ "${stat##*) }" != Z* ]]
}

# Every descriptor above stderr closed, in the current (sub)shell: what a daemon started from here must not inherit.
close_inherited_fds() {
    local fd fds
    fds=$(ls "/proc/$BASHPID/fd")
    for fd in $fds; do
        [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
    done
    return 0
}

# Running and not a zombie, whatever its name (just after launch it may still be setsid/nohup/nsenter).
is_running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    [[ "${stat##*) }" != Z* ]]
}

# Our daemon is the live dockerd whose PID is in our pidfile.
our_pid() {
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    is_dockerd "$pid" || return 1
    echo "$pid"
}

# dockerd creates docker0 once at start and never again; if something deletes it (any other dockerd started with
# --bridge=none in this namespace does, at its start), bridge-mode containers fail with "adding interface vethX to
# bridge docker0 failed: Device does not exist" while `docker info` looks healthy. Host-network containers are
# unaffected, so this only warns.
warn_missing_bridge() {
    local pid bridge=${SID_BRIDGE:-docker0}
    [ -z "$NETNS" ] || return 0
    # sid with a bridge the caller passed after --: the caller's to look after.
    [ "$ENGINE" != sid ] || [ -n "$SID_BRIDGE" ] || return 0
    pid=$(our_pid) || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qE -- '--bridge[= ]none' && return 0
    [ -e "/sys/class/net/$bridge" ] && return 0
    printf 'engine: warning: %s is gone (deleted after dockerd started); bridge-mode containers will fail.\n' "$bridge" >&2
    printf 'engine: warning: restore it with: bash %s stop && bash %s\n' "$0" "$0" >&2
}

cannot_provision() {
    cat >&2 <<EOF
engine: cannot provision a Docker engine here: $1.
engine: nodekit needs Docker Engine >= $MIN_ENGINE_MAJOR with the Compose v2 and Buildx CLI plugins.
engine: install them with your system's package manager, for example:
engine:   Debian trixie / Ubuntu 24.04:  sudo apt-get install docker.io docker-compose docker-buildx
engine:   Docker's own apt repository:   sudo apt-get install docker-ce docker-ce-cli containerd.io docker-compose-plugin docker-buildx-plugin
engine:   Fedora:                        sudo dnf install moby-engine docker-compose docker-buildx
engine: then start the daemon (sudo systemctl start docker) and run: make engine
EOF
    exit 1
}

# --- provisioning --------------------------------------------------------------------------------------------

preflight_provision() {
    if [ "$(id -u)" -ne 0 ]; then
        [ -S "$SOCKET" ] && [ ! -w "$SOCKET" ] \
            && cannot_provision "$SOCKET exists but user $(id -un) cannot use it (join the docker group, or run as root)"
        cannot_provision "not running as root"
    fi
    if ! command -v apt-get >/dev/null 2>&1 || ! command -v dpkg >/dev/null 2>&1; then
        cannot_provision "no apt-get/dpkg (not Debian)"
    fi
    # shellcheck disable=SC1091
    . /etc/os-release 2>/dev/null || true
    [ "${ID:-}" = debian ] || cannot_provision "not Debian (ID=${ID:-unknown})"
    [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] || cannot_provision "no Debian archive keyring"
    [ "$(dpkg --print-architecture)" = amd64 ] || cannot_provision "architecture $(dpkg --print-architecture) is not amd64"
    local glibc
    glibc=$(dpkg-query -W -f='${Version}' libc6 2>/dev/null || echo 0)
    dpkg --compare-versions "$glibc" ge 2.34 || cannot_provision "glibc $glibc is older than 2.34"
}

side_apt() {
    apt-get -q \
        -o Dir::Etc::SourceList="$CACHE/$SIDE_SUITE.sources" \
        -o Dir::Etc::SourceParts=/nonexistent \
        -o Dir::State::Lists="$CACHE/lists" \
        -o Dir::Cache="$CACHE/apt-cache" \
        "$@"
}

cached_debs_complete() {
    local p
    for p in "${SIDE_PACKAGES[@]}"; do
        compgen -G "$CACHE/debs/${p}_*_amd64.deb" >/dev/null || return 1
    done
}

fetch_side_debs() {
    if cached_debs_complete; then
        say "using cached $SIDE_SUITE packages in $CACHE/debs"
        return
    fi
    mkdir -p "$CACHE/lists/partial" "$CACHE/apt-cache/archives/partial" "$CACHE/debs"
    cat >"$CACHE/$SIDE_SUITE.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: $SIDE_SUITE
Components: main
Architectures: amd64
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    say "reading the $SIDE_SUITE package index (separate lists dir $CACHE/lists)"
    side_apt update >"$CACHE/apt-update.log" 2>&1 || { cat "$CACHE/apt-update.log" >&2; die "apt-get update for $SIDE_SUITE failed"; }
    say "downloading ${SIDE_PACKAGES[*]} from $SIDE_SUITE into $CACHE/debs"
    # _apt must be able to write where apt-get download saves, or apt warns and downloads unsandboxed.
    chown _apt:root "$CACHE/debs" 2>/dev/null || true
    (cd "$CACHE/debs" && side_apt download "${SIDE_PACKAGES[@]}" >"$CACHE/apt-download.log" 2>&1) \
        || { cat "$CACHE/apt-download.log" >&2; die "downloading $SIDE_SUITE packages failed"; }
    cached_debs_complete || die "download finished but packages are missing in $CACHE/debs"
}

# The newest cached .deb of each package, one per line.
selected_debs() {
    local p
    for p in "${SIDE_PACKAGES[@]}"; do
        # shellcheck disable=SC2012
        ls -1 "$CACHE/debs/${p}"_*_amd64.deb | sort -V | tail -n 1
    done
}

unpack_side_debs() {
    local stamp want tmp deb
    stamp="$PREFIX/.nodekit-engine-debs"
    want=$(selected_debs | xargs -n1 basename)
    # A prefix that holds more (docker-cli from a run without a client) is fine: it is never re-unpacked
    # needlessly, because daemons of other users may be running from it.
    if [ -f "$stamp" ] && [ -x "$PREFIX/usr/sbin/dockerd" ] && ! grep -qvxF -f "$stamp" <<<"$want"; then
        say "$PREFIX already holds $(echo "$want" | tr '\n' ' ')"
        return
    fi
    say "unpacking $(echo "$want" | wc -l) packages into $PREFIX"
    tmp="$PREFIX.new.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    # One dpkg -x per package in parallel: decompression dominates and the packages share no files.
    local pids=() pid
    while IFS= read -r deb; do
        dpkg -x "$deb" "$tmp" &
        pids+=($!)
    done < <(selected_debs)
    for pid in "${pids[@]}"; do
        wait "$pid" || die "dpkg -x failed while unpacking into $tmp"
    done
    # docker.io ships docker-init as a link to tini-static, which lives in the system's tini package.
    ln -sfn /usr/bin/tini-static "$tmp/usr/bin/tini-static"
    echo "$want" >"$tmp/.nodekit-engine-debs"
    rm -rf "$PREFIX.old"
    [ -e "$PREFIX" ] && mv "$PREFIX" "$PREFIX.old"
    mv "$tmp" "$PREFIX"
    rm -rf "$PREFIX.old"
}

install_system_packages() {
    local missing=() p
    for p in "${SYSTEM_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -eq 0 ]; then
        say "system packages present: ${SYSTEM_PACKAGES[*]}"
        return
    fi
    say "apt-get install ${missing[*]} (from the system's own suite)"
    export DEBIAN_FRONTEND=noninteractive
    local opts=(-y -q --no-install-recommends -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold)
    if ! apt-get install "${opts[@]}" "${missing[@]}" >"$CACHE/apt-install.log" 2>&1; then
        say "apt-get install failed; refreshing the system package index and retrying"
        apt-get update -q >>"$CACHE/apt-install.log" 2>&1 || true
        apt-get install "${opts[@]}" "${missing[@]}" >>"$CACHE/apt-install.log" 2>&1 \
            || { tail -n 20 "$CACHE/apt-install.log" >&2; die "apt-get install ${missing[*]} failed"; }
    fi
}

# sid's plugins are not linked into $PLUGIN_DIR, which the trixie engine's clients share: sid's docker CLI finds
# them through cliPluginsExtraDirs (searched before every other plugin directory) in its own DOCKER_CONFIG.
write_sid_client_config() {
    local plugins="$PREFIX/usr/libexec/docker/cli-plugins"
    mkdir -p "$CLIENT_CONFIG"
    printf '{"cliPluginsExtraDirs": ["%s"]}\n' "$plugins" >"$CLIENT_CONFIG/config.json.new"
    mv "$CLIENT_CONFIG/config.json.new" "$CLIENT_CONFIG/config.json"
    say "sid client: $PREFIX/usr/bin/docker, DOCKER_CONFIG=$CLIENT_CONFIG (plugins from $plugins)"
}

link_client_and_plugins() {
    if [ "$ENGINE" = sid ]; then
        write_sid_client_config
        return
    fi
    mkdir -p "$PLUGIN_DIR"
    local plugin
    for plugin in docker-compose docker-buildx; do
        ln -sfn "$PREFIX/usr/libexec/docker/cli-plugins/$plugin" "$PLUGIN_DIR/$plugin"
    done
    say "compose and buildx plugins linked into $PLUGIN_DIR"
    if command -v docker >/dev/null 2>&1; then
        return
    fi
    # No client on PATH: do_up added trixie's docker-cli (same release as the engine) to the unpacked set.
    if [ -e /usr/local/bin/docker ]; then
        say "/usr/local/bin/docker already exists (not on this PATH); leaving it in place"
    else
        ln -s "$PREFIX/usr/bin/docker" /usr/local/bin/docker
        say "docker client linked as /usr/local/bin/docker"
    fi
    export PATH="/usr/local/bin:$PATH"
}

# A dockerd that died hard leaves $EXEC_ROOT/containerd/containerd.pid behind, naming a containerd that is
# either still running or already a zombie (PID 1 here reaps late). The next dockerd SIGTERMs that pid and
# waits 10 s because kill -0 still succeeds on a zombie. Clear it first, zombie-aware.
stop_orphan_containerd() {
    local pidfile="$EXEC_ROOT/containerd/containerd.pid" pid stat _
    pid=$(cat "$pidfile" 2>/dev/null) || return 0
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { rm -f "$pidfile"; return 0; }
    if [[ "$stat" == "$pid (containerd) "* ]] && is_running "$pid" \
        && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$EXEC_ROOT/containerd/containerd.toml" \
        && ! is_dockerd "$(awk '{print $2}' <<<"${stat##*) }")"; then
        say "stopping containerd pid $pid left behind by the dead dockerd"
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 50); do is_running "$pid" || break; sleep 0.1; done
        is_running "$pid" && kill -KILL "$pid" 2>/dev/null
    fi
    # Not running, a zombie, or some other process that reused the pid: the file is stale either way.
    if ! is_running "$pid" || [[ "$(cat "/proc/$pid/stat" 2>/dev/null)" != "$pid (containerd) "* ]]; then
        rm -f "$pidfile"
    fi
}

# dockerd takes a bridge with a name other than docker0 only if it exists, with the address it is to use.
ensure_sid_bridge() {
    [ -n "$SID_BRIDGE" ] || return 0
    [ -e "/sys/class/net/$SID_BRIDGE" ] && return 0
    say "making bridge $SID_BRIDGE ($SID_BRIDGE_ADDR) for sid's $STORE daemon"
    ip link add "$SID_BRIDGE" type bridge || die "cannot make bridge $SID_BRIDGE (ip link add)"
    ip addr add "$SID_BRIDGE_ADDR" dev "$SID_BRIDGE" || die "cannot give $SID_BRIDGE the address $SID_BRIDGE_ADDR"
    ip link set "$SID_BRIDGE" up || die "cannot bring $SID_BRIDGE up"
}

# After stop: the bridge goes with the last live dockerd that names it (another sid daemon of the same store, started
# with its own --socket/--pidfile, may still use it).
remove_sid_bridge() {
    local f pid
    [ -n "$SID_BRIDGE" ] && [ -e "/sys/class/net/$SID_BRIDGE" ] || return 0
    for f in /proc/[0-9]*/cmdline; do
        pid=${f#/proc/}; pid=${pid%/cmdline}
        is_dockerd "$pid" && tr '\0' ' ' <"$f" 2>/dev/null | grep -qF -- "--bridge $SID_BRIDGE " && return 0
    done
    ip link del "$SID_BRIDGE" && say "removed bridge $SID_BRIDGE"
}

start_daemon() {
    local pid
    if pid=$(our_pid); then
        say "dockerd (pid $pid, from $PIDFILE) is running; waiting for it to answer"
    else
        if [ -f "$PIDFILE" ]; then
            say "removing stale pidfile $PIDFILE"
            rm -f "$PIDFILE"
            stop_orphan_containerd
        fi
        if [ -S "$SOCKET" ]; then
            # Nothing answered on it (check_all ran first), so it is a leftover of a dead daemon.
            say "removing stale socket $SOCKET"
            rm -f "$SOCKET"
        fi
        mkdir -p "$(dirname "$LOG")" "$(dirname "$PIDFILE")" "$(dirname "$SOCKET")"
        ensure_sid_bridge
        # The containerd store picks its snapshotter itself: --storage-driver overlay2 there names a snapshotter
        # that does not exist ("snapshotter not loaded: overlay2"), so it is given to the classic store only.
        # Both keep their BuildKit cache under BUILD_CACHE_KEEP (BuildKit collects after builds): the test suite's
        # builds add about 14 GiB of it in a run, which used to stay until a prune.
        local config="${PIDFILE%.pid}.daemon.json" gc features=""
        gc="\"builder\": {\"gc\": {\"enabled\": true, \"defaultKeepStorage\": \"$BUILD_CACHE_KEEP\"}}"
        local store_args=(--storage-driver overlay2 --config-file "$config")
        if [ "$STORE" = containerd ]; then
            features='"features": {"containerd-snapshotter": true}, '
            store_args=(--config-file "$config")
        fi
        printf '{%s%s}\n' "$features" "$gc" >"$config"
        local cmd=(dockerd --host "unix://$SOCKET" --data-root "$DATA_ROOT" --exec-root "$EXEC_ROOT"
                   --pidfile "$PIDFILE" "${store_args[@]}" "${EXTRA_ARGS[@]}")
        if [ -n "$NETNS" ]; then
            [ -e "/var/run/netns/$NETNS" ] || die "network namespace /var/run/netns/$NETNS does not exist"
            cmd=(nsenter "--net=/var/run/netns/$NETNS" "${cmd[@]}")
        fi
        say "starting ${cmd[*]} (log $LOG)"
        # dockerd finds containerd, the shims, docker-proxy and docker-init through PATH.
        # The daemon outlives this script: it keeps none of the descriptors its caller opened (a `flock LOCK make
        # test` holding the lock on fd 3 would otherwise stay locked for as long as dockerd and containerd run).
        (
            close_inherited_fds
            PATH="$PREFIX/usr/sbin:$PREFIX/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
                exec setsid nohup "${cmd[@]}"
        ) >>"$LOG" 2>&1 </dev/null &
        # Without job control the subshell execs, and neither setsid nor nohup forks: $! is dockerd itself.
        pid=$!
    fi
    local deadline=$((SECONDS + TIMEOUT))
    until server_version >/dev/null; do
        if ! is_running "$pid"; then
            tail -n 20 "$LOG" >&2 || true
            die "dockerd (pid $pid) exited before answering on $SOCKET (log: $LOG)"
        fi
        if [ $SECONDS -ge $deadline ]; then
            tail -n 20 "$LOG" >&2 || true
            die "dockerd did not answer on $SOCKET within ${TIMEOUT}s (log: $LOG)"
        fi
        sleep 0.2
    done
}

do_up() {
    local line start=$SECONDS
    if line=$(check_all); then
        echo "engine: ready: $line"
        warn_missing_bridge
        return 0
    fi
    preflight_provision
    say "provisioning Docker engine ($SIDE_SUITE packages, prefix $PREFIX, cache $CACHE)"
    mkdir -p "$CACHE"
    if ! command -v docker >/dev/null 2>&1 && [[ " ${SIDE_PACKAGES[*]} " != *" docker-cli "* ]]; then
        SIDE_PACKAGES+=(docker-cli)
    fi
    # The system's apt-get install (dpkg lock, system lists) and the trixie fetch/unpack (own lists, own cache,
    # no dpkg database) touch disjoint state, so they overlap: about 4 s less on a fresh 2-core machine.
    install_system_packages &
    local sys_pid=$!
    fetch_side_debs
    unpack_side_debs
    wait "$sys_pid" || die "installing system packages failed (log: $CACHE/apt-install.log)"
    link_client_and_plugins
    if server_version >/dev/null; then
        local v
        v=$(server_version)
        [ "${v%%.*}" -ge "$MIN_ENGINE_MAJOR" ] 2>/dev/null \
            || cannot_provision "an engine $v (older than $MIN_ENGINE_MAJOR) not started by nodekit already answers on $SOCKET"
        if [ "$ENGINE" = sid ] && [ "$v" != "$(packaged_version)" ]; then
            die "engine $v, not sid's $(packaged_version), answers on $SOCKET; stop it or give sid another --socket"
        fi
        say "an engine already answers on $SOCKET; not starting another"
    else
        start_daemon
    fi
    line=$(check_all) || die "engine started but compose/buildx checks still fail (see $LOG)"
    echo "engine: ready: $line (provisioned in $((SECONDS - start))s)"
}

do_status() {
    local line
    if line=$(check_all); then
        echo "engine: ready: $line"
        warn_missing_bridge
    elif [ "$ENGINE" = sid ] && ! sid_client_ready; then
        echo "engine: not ready: sid's engine is not provisioned in $PREFIX (run: bash $0 --engine sid --store $STORE up)"
        return 1
    else
        echo "engine: not ready on $SOCKET (server: $(server_version || echo none), compose: $(compose_version || echo none), buildx: $(buildx_version || echo none))"
        return 1
    fi
}

# Shell exports for a client of this engine: eval "$(bash scripts/engine.sh --engine sid --store containerd env)".
# NODEKIT_DOCKERD makes the virtual cluster of tests/cluster start its per-host daemons from the same prefix.
do_env() {
    printf 'export DOCKER_HOST=%q\n' "unix://$SOCKET"
    [ "$ENGINE" = sid ] || return 0
    # shellcheck disable=SC2016
    printf 'export PATH=%q:"$PATH"\n' "$PREFIX/usr/bin"
    printf 'export DOCKER_CONFIG=%q\n' "$CLIENT_CONFIG"
    printf 'export NODEKIT_DOCKERD=%q\n' "$PREFIX/usr/sbin/dockerd"
}

# dockerd 26.1 and 28.5 leave the nsfs mount of their default sandbox behind when they stop; it keeps the exec
# root busy ("Device or resource busy" on rm -rf). Only called once our daemon is gone.
unmount_leftovers() {
    local m="$EXEC_ROOT/netns/default"
    if grep -qF " $m nsfs " /proc/mounts 2>/dev/null; then
        umount "$m" 2>/dev/null && say "unmounted $m (left by dockerd)"
    fi
    return 0
}

do_stop() {
    local pid _
    if ! pid=$(our_pid); then
        if [ -f "$PIDFILE" ]; then
            say "removing stale pidfile $PIDFILE (no dockerd with that pid)"
            rm -f "$PIDFILE"
        fi
        say "no dockerd started by this script is running ($PIDFILE); nothing to stop"
        return 0
    fi
    say "stopping dockerd pid $pid (SIGTERM; it stops its containers and containerd)"
    kill -TERM "$pid"
    for _ in $(seq 1 300); do
        is_dockerd "$pid" || { say "dockerd pid $pid stopped"; rm -f "$PIDFILE"; unmount_leftovers; return 0; }
        sleep 0.1
    done
    say "dockerd pid $pid still running after 30s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$PIDFILE"
}

main() {
    parse_args "$@"
    case "$ACTION" in
        up) do_up ;;
        status) do_status ;;
        stop) do_stop; remove_sid_bridge ;;
        env) do_env ;;
    esac
}

main "$@"
