"""python-on-whales is imported lazily, one thread at a time: two threads importing it at once (one through the
package, one through its ``exceptions`` module) can fail with CPython's _DeadlockError on its circular imports, as
`nodekit up` once did in CI (its images listed in a thread while the main thread inspected the base)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

NODEKIT = Path(__file__).resolve().parents[4] / "nodekit"


def test_every_lazy_import_of_python_on_whales_comes_after_the_one_lock() -> None:
    unguarded = []
    for path in sorted(NODEKIT.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            loaded = False
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "whales_loaded":
                    loaded = True
            for node in ast.walk(fn):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if (
                    any(n.split(".")[0] == "python_on_whales" for n in names)
                    and not loaded
                    and fn.name != "whales_loaded"
                ):
                    unguarded.append(f"{path.relative_to(NODEKIT.parent)}:{node.lineno} in {fn.name}")
    assert unguarded == []


def test_threads_that_import_it_at_once_through_nodekit_all_get_it() -> None:
    code = """
import threading
from nodekit.system.docker import calls, images
errors, barrier = [], threading.Barrier(4)
def one(i):
    barrier.wait()
    try:
        calls.docker_argv(None, "version") if i % 2 else calls.whales_loaded()
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
print(errors)
"""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr
