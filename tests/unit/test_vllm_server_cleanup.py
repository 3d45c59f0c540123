"""A local server started through core.engines.vllm_engine.VllmServer is stopped at exit even when nothing refers to
it any more (a CLI comparison that just returned). The process is real: a tiny HTTP server that answers /health like
vLLM does, so no model is loaded. The exit is real too: a Python process of its own starts the server, drops it and
exits, and its exit hook must take the server's process group with it. (Run in this process, the hook would also stop
the servers tests/vllm starts here while the unit tests run.)"""
import socket
import subprocess
import sys
import time
from pathlib import Path

from core.engines.vllm_engine import group_members

HEALTH_SERVER = ("import http.server as h, sys\n"
                 "class H(h.BaseHTTPRequestHandler):\n"
                 "    def do_GET(self):\n"
                 "        self.send_response(200); self.end_headers()\n"
                 "    def log_message(self, *a): pass\n"
                 "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")

# the CLI's case: a server started, every reference dropped (a WeakSet of live servers lost it here, and its processes
# outlived the CLI), then a normal exit
DROP_AND_EXIT = ("import gc, sys\n"
                 "from core.engines.vllm_engine import VllmServer\n"
                 "server = VllmServer([sys.executable, '-c', sys.argv[1], sys.argv[2]], int(sys.argv[2]))"
                 ".start(timeout_s=60)\n"
                 "print(server.proc.pid, flush=True)\n"
                 "del server\n"
                 "gc.collect()\n")


def test_a_dropped_server_is_still_stopped_at_exit():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-c", DROP_AND_EXIT, HEALTH_SERVER, str(port)], capture_output=True,
                         text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    pgid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 5  # the hook waits for the group before the process exits; a margin for the kernel
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_members(pgid), "the server's processes outlived the exit hook"
