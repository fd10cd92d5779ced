"""``nodekit top``'s sampler, pure: the POSIX sh script that runs on a node (one long-lived SSH session per host,
or a local ``sh`` for this machine), what it prints parsed into :class:`Tick`\\ s, two ticks made into a row, and
which node has gone quiet.

The script costs the node next to nothing (``benchmarks/top_cost.py`` measures it): each tick reads a few
counters with shell builtins (``read`` of the job container's cgroup files and of ``/proc/<pid>/net/dev``), then
sleeps. The docker CLI (a Go program: tens of milliseconds of CPU a start, which every few seconds would be percents
of a core) runs only when the container's process is gone or, while there is none, every ``recheck`` ticks. The
last line is ``tail -n 1`` of the container's own log file (json-file, Docker's default) every ``logs`` ticks, where
this login may read it (root, usually); else ``docker logs --tail 1`` every ``slow`` ticks. ``nvidia-smi`` runs once
for the whole session, in its own loop mode (``-l``). Counters are
cumulative (CPU nanoseconds, bytes); the head divides the difference of two ticks by their distance on the node's
own clock (``/proc/uptime``), so neither the link's latency nor the clocks' skew enter the rates.

Lines, each tick ending with ``end``: ``clock <unix s> <uptime s>`` (once), ``host <name> <MemTotal kB>`` (once),
``state <status> <started> <finished> <exit>``, ``t <uptime>``, ``cpu <ns>``, ``mem <bytes> <inactive file bytes>``,
``net <rx bytes> <tx bytes>``, ``logjson <json-file's last record>`` or ``log <docker's timestamp> <the line>``,
``gpu <index>, <util %>, <MiB used>, <MiB total>, <W>`` (whenever nvidia-smi prints).
"""

from __future__ import annotations

import datetime
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nodekit.system.terminal import printable

SCRIPT = r"""
p=$1; every=$2; logs=$3; recheck=$4; slow=$5; counters=$6
tick=0; pid=0; cid=; lp=; cpu1=; cpu2=; mem=; mstat=  # printf, not echo, for text: dash's echo reads backslashes
read -r up _ < /proc/uptime; echo "clock $(date +%s) $up"
read -r hn < /proc/sys/kernel/hostname; total=0
while read -r k v _; do [ "$k" = MemTotal: ] && total=$v && break; done < /proc/meminfo
echo "host $hn $total"
if [ "$counters" = 1 ] && command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used,memory.total,power.draw \
    --format=csv,noheader,nounits -l "$every" 2>/dev/null | while IFS= read -r l; do printf 'gpu %s\n' "$l"; done &
fi
cgroups() {
  cpu1=; cpu2=; mem=; mstat=
  while IFS=: read -r _ ctl path; do
    case ",$ctl," in
      ,,) [ -f "/sys/fs/cgroup$path/cpu.stat" ] && cpu2=/sys/fs/cgroup$path/cpu.stat &&
          [ -z "$mem" ] && mem=/sys/fs/cgroup$path/memory.current && mstat=/sys/fs/cgroup$path/memory.stat ;;
      *,cpuacct,*) for d in /sys/fs/cgroup/cpuacct /sys/fs/cgroup/cpu,cpuacct /sys/fs/cgroup/cpuacct,cpu; do
          [ -f "$d$path/cpuacct.usage" ] && cpu1=$d$path/cpuacct.usage; done ;;
      *,memory,*) [ -f "/sys/fs/cgroup/memory$path/memory.usage_in_bytes" ] &&
          mem=/sys/fs/cgroup/memory$path/memory.usage_in_bytes && mstat=/sys/fs/cgroup/memory$path/memory.stat ;;
    esac
  done < "/proc/$pid/cgroup"
}
find_job() {
  cid=$(docker ps -a -q --no-trunc --filter "label=com.docker.compose.project=$p" 2>/dev/null |
        { read -r c _; echo "$c"; })
  pid=0; lp=
  if [ -n "$cid" ]; then
    f='{{.State.Pid}} {{.State.Status}} {{.State.StartedAt}} {{.State.FinishedAt}} {{.State.ExitCode}} {{.LogPath}}'
    set -- $(docker inspect -f "$f" "$cid" 2>/dev/null)
    pid=${1:-0}; lp=${6:-}; echo "state ${2:-absent} ${3:--} ${4:--} ${5:--}"
  else
    echo "state absent - - -"
  fi
  if [ "$counters" = 1 ] && [ "$pid" -gt 0 ] && [ -r "/proc/$pid/cgroup" ]; then cgroups; else pid=0; lp=; fi
  [ -n "$lp" ] && [ -r "$lp" ] || lp=
}
while :; do
  if [ "$pid" -gt 0 ]; then [ -d "/proc/$pid" ] || find_job
  elif [ $((tick % recheck)) = 0 ]; then find_job; fi
  read -r up _ < /proc/uptime; echo "t $up"
  if [ "$pid" -gt 0 ] && [ -d "/proc/$pid" ]; then
    if [ -n "$cpu1" ]; then read -r v < "$cpu1" && echo "cpu $v"
    elif [ -n "$cpu2" ]; then
      while read -r k v; do [ "$k" = usage_usec ] && echo "cpu ${v}000" && break; done < "$cpu2"
    fi
    if [ -n "$mem" ] && read -r v < "$mem"; then
      ina=0; while read -r k x; do case $k in total_inactive_file|inactive_file) ina=$x; break;; esac; done < "$mstat"
      echo "mem $v $ina"
    fi
    rx=0; tx=0
    while IFS=': ' read -r name r _ _ _ _ _ _ _ t _; do
      case $name in lo|*[!a-zA-Z0-9._@-]*|'') continue;; esac
      case $r$t in *[!0-9]*|'') continue;; esac
      rx=$((rx + r)); tx=$((tx + t))
    done < "/proc/$pid/net/dev"
    echo "net $rx $tx"
  fi
  if [ -n "$lp" ] && [ $((tick % logs)) = 0 ]; then
    printf 'logjson %s\n' "$(tail -n 1 "$lp" 2>/dev/null)"
  elif [ -n "$cid" ] && [ $((tick % slow)) = 0 ]; then
    printf 'log %s\n' "$(docker logs --tail 1 --timestamps "$cid" 2>&1 |
                        { l=; while IFS= read -r x; do l=$x; done; printf '%s\n' "$l"; })"
  fi
  echo end
  tick=$((tick + 1))
  sleep "$every"
done
"""


@dataclass(frozen=True)
class Gpu:
    index: int
    util: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class Tick:
    """One tick of one node's sampler: its counters at ``uptime`` (seconds on the node's own clock)."""

    uptime: float
    cpu_ns: int | None = None
    mem: int | None = None
    inactive: int = 0
    rx: int | None = None
    tx: int | None = None


@dataclass
class NodeView:
    """Everything a node's sampler has said so far (the head's side of one session)."""

    rank: int
    where: str
    hostname: str = ""
    mem_total: int | None = None
    wall_at_uptime: float | None = None  # the node's unix time minus its uptime: its own clock for log ages
    state: str = "connecting"
    started: str = ""
    finished: str = ""
    exit_code: str = ""
    ticks: list[Tick] = field(default_factory=list)
    last_line: str = ""
    last_line_at: float | None = None  # the node's unix time of that line (Docker's timestamp)
    gpus: dict[int, Gpu] = field(default_factory=dict)
    problem: str = ""
    _pending: dict[str, Any] = field(default_factory=dict)

    def feed(self, line: str) -> bool:
        """One line of the sampler; True when it ended a tick."""
        key, _, rest = line.strip().partition(" ")
        words = rest.split()
        try:
            if key == "clock" and len(words) == 2:
                self.wall_at_uptime = float(words[0]) - float(words[1])
            elif key == "host" and words:
                self.hostname = words[0]
                self.mem_total = int(words[1]) * 1024 if len(words) > 1 and words[1].isdigit() else None
            elif key == "state" and words:
                self.state, self.started, self.finished, self.exit_code = [*words[:4], "-", "-", "-"][:4]
            elif key == "t" and words:
                self._pending = {"uptime": float(words[0])}
            elif key == "cpu" and words:
                self._pending["cpu_ns"] = int(words[0])
            elif key == "mem" and words:
                self._pending["mem"], self._pending["inactive"] = int(words[0]), int(words[1]) if len(words) > 1 else 0
            elif key == "net" and len(words) == 2:
                self._pending["rx"], self._pending["tx"] = int(words[0]), int(words[1])
            elif key == "log":
                self._log(rest)
            elif key == "logjson":
                self._logjson(rest)
            elif key == "gpu":
                self._gpu(rest)
            elif key == "end" and "uptime" in self._pending:
                self.ticks = [*self.ticks[-1:], Tick(**self._pending)]
                self._pending = {}
                return True
        except ValueError:
            pass  # a torn line (the session ended mid-write): the next tick is whole
        return False

    def _log(self, rest: str) -> None:
        stamp, _, text = rest.partition(" ")
        at = docker_time(stamp)
        if at is not None:
            self.last_line, self.last_line_at = printable(text), at

    def _logjson(self, rest: str) -> None:
        """json-file's record: ``{"log": "text\\n", "stream": "stdout", "time": "2026-...Z"}`` (a torn or foreign
        line is passed over)."""
        try:
            item = json.loads(rest)
        except ValueError:
            return
        at = docker_time(str(item.get("time", ""))) if isinstance(item, dict) else None
        if at is not None and isinstance(item.get("log"), str):
            self.last_line, self.last_line_at = printable(item["log"]), at

    def _gpu(self, rest: str) -> None:
        parts = [p.strip() for p in rest.split(",")]
        if not parts or not parts[0].isdigit():
            return
        nums = [_num(p) for p in parts[1:5]] + [None] * 4
        self.gpus[int(parts[0])] = Gpu(int(parts[0]), *nums[:4])


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # [N/A], [Not Supported]


def docker_time(stamp: str) -> float | None:
    """Docker's RFC 3339 timestamp (nanoseconds, Z) as unix time; None when it is not one."""
    if not stamp or stamp[0] not in "0123456789":
        return None
    head, _, frac = stamp.rstrip("Z").partition(".")
    try:
        t = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
    return t.timestamp() + (float(f"0.{frac[:9]}") if frac.isdigit() else 0.0)


@dataclass(frozen=True)
class Row:
    """One node in ``nodekit top``: rates over the last two ticks."""

    rank: int
    host: str
    state: str
    since: str = ""
    cpu_pct: float | None = None
    mem_bytes: int | None = None
    mem_pct: float | None = None
    rx_bps: float | None = None
    tx_bps: float | None = None
    gpus: tuple[Gpu, ...] = ()
    last_line: str = ""
    line_age_s: float | None = None
    quiet: bool = False
    problem: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.rank, "host": self.host, "state": self.state, "since": self.since,
            "cpu_pct": _round(self.cpu_pct), "mem_bytes": self.mem_bytes, "mem_pct": _round(self.mem_pct),
            "rx_bps": _round(self.rx_bps), "tx_bps": _round(self.tx_bps),
            "gpus": [{"index": g.index, "util": g.util, "mem_used_mib": g.mem_used_mib,
                      "mem_total_mib": g.mem_total_mib, "power_w": g.power_w} for g in self.gpus],
            "last_line": self.last_line, "line_age_s": _round(self.line_age_s), "quiet": self.quiet,
            "problem": self.problem,
        }  # fmt: skip


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def row(view: NodeView) -> Row:
    """The row of one node from what its sampler said (pure)."""
    cpu = mem = rx = tx = None
    mem_bytes = None
    if view.ticks:
        last = view.ticks[-1]
        if last.mem is not None:
            mem_bytes = max(0, last.mem - last.inactive)
            mem = 100.0 * mem_bytes / view.mem_total if view.mem_total else None
        if len(view.ticks) == 2:
            prev = view.ticks[0]
            dt = last.uptime - prev.uptime
            if dt > 0:
                if last.cpu_ns is not None and prev.cpu_ns is not None:
                    cpu = max(0.0, (last.cpu_ns - prev.cpu_ns) / dt / 1e9 * 100)
                if last.rx is not None and prev.rx is not None and last.tx is not None and prev.tx is not None:
                    rx, tx = max(0.0, (last.rx - prev.rx) / dt), max(0.0, (last.tx - prev.tx) / dt)
    age = None
    if view.last_line_at is not None and view.wall_at_uptime is not None and view.ticks:
        age = max(0.0, view.wall_at_uptime + view.ticks[-1].uptime - view.last_line_at)
    since = view.started if view.state == "running" else view.finished
    state = view.state if view.state != "exited" else f"exited ({view.exit_code})"
    return Row(rank=view.rank, host=view.hostname or view.where, state=state, since=since.split(".")[0].rstrip("Z"),
               cpu_pct=cpu, mem_bytes=mem_bytes, mem_pct=mem, rx_bps=rx, tx_bps=tx,
               gpus=tuple(view.gpus[i] for i in sorted(view.gpus)), last_line=view.last_line, line_age_s=age,
               problem=view.problem)  # fmt: skip


QUIET_AGE_S = 60.0
QUIET_CPU_SHARE = 0.1


def mark_quiet(rows: Sequence[Row], quiet_age_s: float = QUIET_AGE_S) -> list[Row]:
    """Rows with ``quiet`` set for each running node whose output and CPU went quiet while the others progress:
    its last line is older than ``quiet_age_s`` and than three times the others' typical age, and its CPU is under
    a tenth of theirs. Pure; a single node, or a fleet that is quiet as a whole, marks nobody."""
    running = [r for r in rows if r.state == "running" and r.line_age_s is not None and r.cpu_pct is not None]
    marked = set()
    for r in running:
        others = [o for o in running if o.rank != r.rank]
        if not others:
            continue
        age = statistics.median(o.line_age_s for o in others if o.line_age_s is not None)
        cpu = statistics.median(o.cpu_pct for o in others if o.cpu_pct is not None)
        assert r.line_age_s is not None and r.cpu_pct is not None
        if r.line_age_s > max(quiet_age_s, 3 * age) and age < quiet_age_s and r.cpu_pct < QUIET_CPU_SHARE * cpu:
            marked.add(r.rank)
    return [replace(r, quiet=r.rank in marked) for r in rows]


def sample_of(r: Row, now: float) -> dict[str, Any]:
    """What a run's record keeps of a row (samples.jsonl): the time, the node and the numbers."""
    d = {k: v for k, v in r.as_dict().items() if k not in ("host", "last_line", "problem", "since")}
    return {"t": round(now, 3), "rank": r.rank, **{k: v for k, v in d.items() if k != "node"}}


RECHECK_S = 10.0  # while the node has no running container: how often to look for one
SLOW_LOGS_S = 30.0  # where the log file cannot be read: how often docker logs reads the last line


def samplers_args(project: str, every: float, logs_every_s: float, counters: bool) -> list[str]:
    """The script's arguments: project, seconds between ticks, ticks between log reads (from the file), ticks
    between looks for a container, ticks between ``docker logs``, whether this host's /proc and cgroups are the
    node's (not for a tcp:// engine)."""

    def ticks(seconds: float) -> str:
        return str(max(1, round(seconds / every)))

    return [project, f"{every:g}", ticks(logs_every_s), ticks(RECHECK_S), ticks(SLOW_LOGS_S), "1" if counters else "0"]


def totals(rows: Iterable[Row]) -> Mapping[str, float]:
    """Sums over the fleet (for the table's footer)."""
    rows = list(rows)
    return {"cpu_pct": sum(r.cpu_pct or 0.0 for r in rows), "mem_bytes": float(sum(r.mem_bytes or 0 for r in rows))}
