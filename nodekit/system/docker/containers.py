"""Throw-away containers of an image: the probes that read what an image holds, and ``nodekit doctor``'s test
container set up as a node's job is. Each is removed, also when its deadline stops it or a signal stops nodekit,
and labelled so that one left by a nodekit killed outright can be found (:data:`PROBE_LABEL`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from nodekit.errors import DeadlineError, EngineError, ImageError
from nodekit.system import proc
from nodekit.system.docker import calls
from nodekit.system.docker.calls import CONTAINER_START_S, docker_argv, stderr_tail

PROBE_LABEL = "org.nodekit.probe"
"""Every throw-away container carries it, valued with its own name: ``docker ps -a --filter label=org.nodekit.probe``
finds one whatever became of nodekit (SIGKILL), and nodekit finds its own again after an interrupt."""


def _throwaway(
    host: str | None, run_args: list[str], *, deadline: float, what: str, fix: str, env: Mapping[str, str] | None = None
) -> proc.Result:
    """``docker run --rm --name N --label org.nodekit.probe=N <run_args>`` to its end. Whatever ends the wait
    first (its deadline: DeadlineError; Ctrl-C or a stop signal: that exception) removes the container before it
    goes on: killing the docker client leaves a container running, or ``Created`` and never started (``--rm``
    removes only one that ran), with nothing but its label to find it by."""
    import secrets

    name = f"nodekit-probe-{secrets.token_hex(6)}"
    argv = docker_argv(host, "run", "--rm", "--name", name, "--label", f"{PROBE_LABEL}={name}", *run_args)
    try:
        return proc.run(argv, deadline=deadline, what=what, fix=fix, env=None if env is None else proc.environ(env))
    except BaseException:
        _remove(host, name)
        raise


def _remove(host: str | None, name: str) -> None:
    """Remove the throw-away container ``name``; once more by its label a moment later, for a create the engine was
    still carrying out when its client was killed. Never raises: the caller's exception is what the user sees."""
    import time

    def rm(*refs: str) -> None:
        with contextlib.suppress(OSError, DeadlineError):
            proc.run(docker_argv(host, "rm", "-f", *refs), deadline=calls.ENGINE_CALL_S, what="docker rm", fix="")

    rm(name)
    time.sleep(0.5)
    with contextlib.suppress(OSError, DeadlineError):
        listed = proc.run(docker_argv(host, "ps", "--all", "--quiet", "--filter", f"label={PROBE_LABEL}={name}"),
                          deadline=calls.ENGINE_CALL_S, what="docker ps", fix="").stdout.split()  # fmt: skip
        if listed:
            rm(*listed)


def run_in_image(ref: str, command: list[str], *, entrypoint: str | None = None, host: str | None = None) -> str:
    """Run ``command`` in a throw-away container of ``ref`` with no network; its standard output."""
    args = ["--network", "none", "--pull", "never", *(["--entrypoint", entrypoint] if entrypoint else []), ref]
    fix = f"docker run --rm {ref}"
    try:
        done = _throwaway(host, [*args, *command], deadline=CONTAINER_START_S, what=f"running {command[0]} in {ref}",
                          fix=fix)  # fmt: skip
    except DeadlineError:
        hung = f"running {command[0]} in {ref} did not finish within {CONTAINER_START_S:.0f} s"
        raise ImageError(hung, fix=fix) from None
    if done.returncode != 0:
        raise ImageError(f"running {command[0]} in {ref} failed: {_docker_run_error(done.stderr)}", fix=fix)
    return done.stdout


def probe_image(ref: str, script: str, *, env: Mapping[str, str], timeout: float, host: str | None = None) -> str:
    """``sh -c script`` in a throw-away container of ``ref``: no network, the image's own user and PATH, ``env``
    added; its standard output. ImageError with Docker's reason when it cannot start (an image without ``sh``),
    fails, or outlives ``timeout`` seconds (the container is then removed, as after Ctrl-C)."""
    args = ["--network", "none", "--pull", "never", *(a for k in sorted(env) for a in ("--env", k)),
            "--entrypoint", "sh", ref, "-c", script]  # fmt: skip
    fix = f"docker run --rm --network none --entrypoint sh {ref} -c 'python3 -V'"
    try:
        done = _throwaway(host, args, deadline=timeout, what=f"probing {ref}", fix=fix, env=env)
    except DeadlineError:
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
    args = ["--network", "host", "--ipc", "host", *(f"--ulimit={u}" for u in ulimits or []),
            *(["--gpus", "all"] if gpus else []), "--entrypoint", "sh", ref, "-c", script]  # fmt: skip
    fix = f"docker run --rm --network host --ipc host{' --gpus all' if gpus else ''} --entrypoint true {ref}"
    try:
        done = _throwaway(host, args, deadline=timeout, what=f"a test container of {ref}", fix=fix)
    except DeadlineError:
        # Killing the client left the container running: removed (above), or it would hold the ports and GPUs.
        raise EngineError(
            f"a test container of {ref} did not finish within {timeout} s (it hung); it was removed", fix=fix
        ) from None
    if done.returncode != 0:
        why = _docker_run_error(done.stderr)
        raise EngineError(f"a test container of {ref} failed: {why.removeprefix('docker: ')}", fix=fix)
    return done.stdout
