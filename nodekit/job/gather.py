"""What one node's plan needs from the world, gathered first into one frozen :class:`NodeWorld`.

Gather, then plan: :func:`gather_node` does every read the plan needs (the training script on disk, main's name in
DNS, this host's facts and routes, the mount sources, the engine's images, the job secret, the shell's environment,
the working directory) and refuses what it finds wrong, deciding the node (:class:`~nodekit.job.spec.NodeSpec`) once on
the way; :func:`nodekit.backends.compose.node.plan` is then a pure function of the settings and that value, so a plan
can be printed, compared with a golden file, or made for another machine's facts without touching this one. A world
made by hand (another machine's facts) goes through :func:`world_of`, held to the same refusals."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from nodekit.config.settings import Settings
from nodekit.errors import NetworkError, UsageError
from nodekit.job.spec import (
    LaunchSpec,
    NodeSpec,
    check_mounts,
    check_rank,
    decide_node,
    launch_spec,
    main_address,
)
from nodekit.system.host import facts as host_facts
from nodekit.system.host import net
from nodekit.system.host.facts import HostFacts


@dataclass(frozen=True)
class NodeWorld:
    """Everything a node's plan takes from outside the settings, and the node decided from it: one value, printable
    and comparable.

    ``node`` is the node as the settings and these facts decide it (:func:`decide_node`: made once, while gathering
    refuses what is wrong, and planned from as it is). ``facts`` are the node's host facts as gathered (or as its
    host reported them), with the config's per-node pins (:func:`nodekit.job.spec.pinned_host_facts`). ``absent``
    lists the node's mount sources that do not exist where it runs (empty when they were checked elsewhere, or
    cannot be). ``image_note`` says why nodekit chose ``image`` ("" when it was named). ``image_id`` is the image's
    id on the node's engine when it was looked up ("" otherwise: not rendered). ``env_set`` holds the names of the
    job's ``pass_env`` variables the launching shell sets: names only, their values stay in the shell (Compose reads
    them at start). ``main_note`` says which address node 0 took for main when none was given
    ("" otherwise). ``cwd`` is the directory the compose file's path hint is shown relative to."""

    node: NodeSpec
    main_ip: str
    facts: HostFacts
    image: str
    cwd: Path
    image_note: str = ""
    image_id: str = ""
    job_secret: str = ""
    absent: tuple[str, ...] = ()
    env_set: frozenset[str] = field(default_factory=frozenset)
    main_note: str = ""


def gather_node(
    settings: Settings,
    rank: int,
    main: str | None,
    *,
    image: str | None = None,
    facts: HostFacts | None = None,
    mounts_checked: bool = False,
    environ: Mapping[str, str] | None = None,
    image_id: Callable[[str], str] | None = None,
    job_secret: Callable[[], str] | None = None,
    dry_run: bool = False,
    launch: LaunchSpec | None = None,
) -> NodeWorld:
    """Gather node ``rank``'s world on this machine (``main`` None: :func:`main_address`'s default), refusing what is
    wrong in the order a user meets it: the training command, the rank (the most likely typo), main's address, the
    route toward main (and, for rank 0 on host networking, that main is this machine), the node's settings, its
    mount sources, the image. Raises
    UsageError/NetworkError/ImageError; writes nothing, except what ``job_secret`` may (asked for last, once
    everything else passed: it may create the project's secret file).

    ``facts`` given (gathered on the node itself, or declared) skips this host's facts and its route checks;
    ``mounts_checked`` skips the mount sources (checked where the node runs). Without ``image`` the project's image
    is chosen on this host's engine (:func:`nodekit.image.builder.choose`). ``image_id`` looks the image's id up on this
    host (``nodekit up`` passes one; ``compose`` and dry runs do not, so they never need the image here).
    ``environ`` is the launching shell's environment (default: this process's). ``dry_run``: choosing the image
    starts no probe container and writes no probe cache (a base never probed here leaves the fingerprint unknown).
    ``launch`` is the command's launch spec when it already holds one (:func:`check_command`'s), passed down rather
    than built again."""
    launch = launch or check_command(settings)
    check_rank(launch, rank)  # before anything slower: the most likely typo is the rank
    addr = main_address(settings, rank, main, net.default_address_here)
    main_ip = net.resolve(addr)
    main_note = ""
    if not main and not settings.main and settings.nnodes > 1:
        main_note = f"main is {main_ip}, this host's address on its default route (--main chooses another)"
    if facts is None:
        facts = _facts_here(rank, main_ip, host_network=settings.network == "host")
    # Bad settings for this node are refused here, in the order a user meets them; the node decided is the one planned.
    node, facts = decide_node(settings, launch, rank, main_ip, facts)
    absent = () if mounts_checked else tuple(m.host for m in node.mounts if not Path(m.host).exists())
    check_mounts(node, absent)
    ref, why, known_id = image, "", ""
    if not ref:
        from nodekit.image.builder import choose

        ref, why, known_id = choose(settings, cached_only=dry_run)
    found = (known_id or image_id(ref)) if image_id else ""
    environ = os.environ if environ is None else environ
    env_set = frozenset(n for n in launch.pass_env if n in environ)
    cwd = Path.cwd()
    secret = job_secret() if job_secret else ""  # last: everything else passed
    return NodeWorld(
        node=node,
        main_ip=main_ip,
        facts=facts,
        image=ref,
        cwd=cwd,
        image_note=why,
        image_id=found,
        job_secret=secret,
        absent=absent,
        env_set=env_set,
        main_note=main_note,
    )


def world_of(
    settings: Settings,
    rank: int,
    main_ip: str,
    facts: HostFacts,
    *,
    image: str,
    cwd: Path,
    launch: LaunchSpec | None = None,
    absent: tuple[str, ...] = (),
    image_note: str = "",
    image_id: str = "",
    job_secret: str = "",
    env_set: frozenset[str] = frozenset(),
    main_note: str = "",
) -> NodeWorld:
    """Pure: node ``rank``'s world from what was gathered elsewhere (its host's report, or declared), its node
    decided (:func:`decide_node`, with the same refusals as :func:`gather_node`). ``launch``: the command's launch
    spec, when it holds one."""
    node, pinned = decide_node(settings, launch or launch_spec(settings), rank, main_ip, facts, absent)
    return NodeWorld(
        node=node, main_ip=main_ip, facts=pinned, image=image, cwd=cwd, image_note=image_note, image_id=image_id,
        job_secret=job_secret, absent=absent, env_set=env_set, main_note=main_note,
    )  # fmt: skip


def _facts_here(rank: int, main_ip: str, *, host_network: bool) -> HostFacts:
    """This host's facts, with a route toward main; for rank 0 on host networking, main must be this machine."""
    facts = host_facts.gather(main_ip)
    if facts.iface is None:
        raise NetworkError(
            f"this host has no route to main address {main_ip}",
            fix="check the address (ip route get " + main_ip + "), or pass the address main has on this network",
            node=f"node {rank}",
        )
    if rank == 0 and host_network:
        check_main_is_here(main_ip, [a for link in net.links_here() for a in link.addrs])
    return facts


def check_command(settings: Settings) -> LaunchSpec:
    """The job's launch spec, once its training command is known to run: exactly one of script and module, and the
    script present in the project (it travels in the image). ``nodekit run`` asks this before anything is checked,
    shipped or started on any host; UsageError otherwise."""
    return _script_present(settings, launch_spec(settings))


def _script_present(settings: Settings, launch: LaunchSpec) -> LaunchSpec:
    """``launch``, unless its script is missing from the project (UsageError with the nearest name as the fix)."""
    if launch.command.script is not None and not settings.resolve(Path(launch.command.script)).is_file():
        near = _near(settings.resolve(Path(launch.command.script)))
        guess = Path(launch.command.script).with_name(near).as_posix() if near else None
        raise UsageError(
            f"training script {launch.command.script} not found in {settings.project_dir}",
            fix=f'did you mean {guess}? set script = "{guess}" in nodekit.toml'
            if guess
            else f"create it, or set script in {settings.project_dir / 'nodekit.toml'} to an existing file",
        )
    return launch


def _near(script: Path) -> str | None:
    """The file beside ``script`` whose name is closest to it (``trian.py`` -> ``train.py``), or None."""
    import difflib

    try:
        names = sorted(p.name for p in script.parent.iterdir() if p.is_file())[:10_000]
    except OSError:
        return None
    close = difflib.get_close_matches(script.name, names, n=1, cutoff=0.75)
    return close[0] if close else None


def check_main_is_here(main_ip: str, addrs: list[str]) -> None:
    """Node 0 hosts the rendezvous at the main address, so that address must be this machine's (loopback is: an
    all-local run). Otherwise every other node would wait for a main that is not there until its timeout."""
    if net.is_loopback(main_ip) or any(_same_ip(main_ip, a) for a in addrs):
        return
    here = ", ".join(a for a in addrs if not net.is_loopback(a.split("%", 1)[0])) or "none but loopback"
    raise UsageError(
        f"node rank 0 is main, but main address {main_ip} is not one of this machine's addresses ({here})",
        fix="run node 0 on the machine that has that address, or pass --main with one of the addresses above",
        node="node 0",
    )


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b.split("%", 1)[0])
    except ValueError:
        return False
