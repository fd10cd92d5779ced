"""A webhook for the cluster tests, run inside a host's namespace (where ``nodekit run`` runs, so that its
127.0.0.1 is the head's): ``python -m tests.cluster.webhook PORT OUT [--hang-first]`` appends every POSTed JSON body
to OUT (one line each, as it arrives) and answers 200; with ``--hang-first`` the first request is read, recorded
and never answered (a webhook that hangs)."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from pathlib import Path


def main(port: int, out: Path, hang_first: bool) -> None:
    lock = threading.Lock()
    seen = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with lock:
                seen[0] += 1
                first = seen[0] == 1
                with out.open("ab") as f:
                    f.write(body.replace(b"\n", b" ") + b"\n")
            if hang_first and first:
                time.sleep(3600)
                return
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    print(f"webhook listening on 127.0.0.1:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), "--hang-first" in sys.argv[3:])
