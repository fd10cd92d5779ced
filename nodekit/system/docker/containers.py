"""Throw-away containers of an image: the probes that read what an image holds, and ``nodekit doctor``'s test
container set up as a node's job is. Each is removed, also when its deadline stops it."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from nodekit.errors import DeadlineError, EngineError, ImageError
from nodekit.system import proc
from nodekit.system.docker import calls
from nodekit.system.docker.calls import CONTAINER_START_S, Engine, client, docker_argv, fails, stderr_tail


def run_in_image(ref: str, command: list[str], *, entrypoint: str | None = None, host: str | None = None) -> str:
    """Run ``command`` in a throw-away container of ``ref`` with no network; its standard output."""
    import uuid

    name = f"nodekit-probe-{uuid.uuid4().hex[:12]}"
    e = Engine(host, deadline=CONTAINER_START_S)
    failed, fix = f"running {command[0]} in {ref} failed", f"docker run --rm {ref}"
    # A container its deadline stopped the client of is still running: removed, not left behind.
    with e.calling(f"running {command[0]} in {ref}", fails(ImageError, failed, fix),
                   undo=lambda: client(host).container.remove(name, force=True)):  # fmt: skip
        out = e.docker.container.run(ref, command, entrypoint=entrypoint, remove=True, networks=["none"], name=name)
    return str(out)


def probe_image(ref: str, script: str, *, env: Mapping[str, str], timeout: float, host: str | None = None) -> str:
    """``sh -c script`` in a throw-away container of ``ref``: no network, the image's own user and PATH, ``env``
    added; its standard output. ImageError with Docker's reason when it cannot start (an image without ``sh``),
    fails, or outlives ``timeout`` seconds (the container is then removed)."""
    import uuid

    name = f"nodekit-probe-{uuid.uuid4().hex[:12]}"
    argv = docker_argv(
        host, "run", "--rm", "--name", name, "--network", "none", "--pull", "never",
        *(a for k in sorted(env) for a in ("--env", k)), "--entrypoint", "sh", ref, "-c", script,
    )  # fmt: skip
    fix = f"docker run --rm --network none --entrypoint sh {ref} -c 'python3 -V'"
    try:
        done = proc.run(argv, deadline=timeout, what=f"probing {ref}", fix=fix, env=proc.environ(env))
    except DeadlineError:
        with contextlib.suppress(DeadlineError):  # the engine hung: the error below says so
            proc.run(docker_argv(host, "rm", "-f", name), deadline=calls.ENGINE_CALL_S, what="docker rm", fix="")
        raise ImageError(f"probing {ref} did not finish within {timeout:.0f} s", fix=fix) from None
    if done.returncode != 0:
        why = _docker_run_error(done.stderr)
        if "executable file not found" in why or "no such file or directory" in why:
            raise ImageError(f"image {ref} has no /bin/sh (so no Python nodekit can use)", fix=fix)
        raise ImageError(f"probing {ref} failed: {why.removeprefix('docker: ')}", fix=fix)
    return done.stdout


def _docker_run_error(stderr: str) -> str:
    """docker run ends its stderr with "Run 'docker run --help' ..."; the reason is the "docker: Error ..." line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    return next((ln for ln in lines if ln.startswith("docker:") or "Error" in ln), stderr_tail(stderr))


def run_as_job(
    ref: str,
    script: str,
    *,
    ulimits: list[str] | None = None,
    gpus: bool = False,
    timeout: float,
    host: str | None = None,
) -> str:
    """``sh -c script`` in a throw-away container of ``ref`` set up as a node's job is (host network and IPC,
    ``ulimits`` such as ``stack=67108864:67108864``, every GPU when ``gpus``); its standard output.

    For ``nodekit doctor``: the limits, shared memory and GPUs a job will see. EngineError, with Docker's own
    error line, when the container cannot start (runc refusing a limit, no NVIDIA runtime), the script fails,
    or it takes longer than ``timeout`` seconds. python-on-whales builds the command line; the process is ours
    so that stderr is captured (its ``run`` lets it through to the terminal) and the wait is bounded.
    """
    import secrets

    name = f"nodekit-probe-{secrets.token_hex(4)}"
    argv = docker_argv(
        host,
        "run", "--rm", "--name", name, "--network", "host", "--ipc", "host",
        *(f"--ulimit={u}" for u in ulimits or []),
        *(["--gpus", "all"] if gpus else []),
        "--entrypoint", "sh", ref, "-c", script,
    )  # fmt: skip
    fix = f"docker run --rm --network host --ipc host{' --gpus all' if gpus else ''} --entrypoint true {ref}"
    try:
        done = proc.run(argv, deadline=timeout, what=f"a test container of {ref}", fix=fix)
    except DeadlineError:
        # Killing the client leaves the container running: remove it, or it would hold the ports and GPUs.
        with contextlib.suppress(OSError, DeadlineError):
            proc.run(docker_argv(host, "rm", "-f", name), deadline=30, what="docker rm", fix="")
        raise EngineError(
            f"a test container of {ref} did not finish within {timeout} s (it hung); it was removed", fix=fix
        ) from None
    if done.returncode != 0:
        why = _docker_run_error(done.stderr)
        raise EngineError(f"a test container of {ref} failed: {why.removeprefix('docker: ')}", fix=fix)
    return done.stdout
