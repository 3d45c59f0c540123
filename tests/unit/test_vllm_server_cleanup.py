"""A local server started through core.engines.vllm_engine.VllmServer is stopped at exit even when nothing refers to
it any more (a CLI comparison that just returned). The process is real: a tiny HTTP server that answers /health like
vLLM does, so no model is loaded."""
import gc
import socket
import sys

from core.engines import vllm_engine
from core.engines.vllm_engine import VllmServer, group_members

HEALTH_SERVER = ("import http.server as h, sys\n"
                 "class H(h.BaseHTTPRequestHandler):\n"
                 "    def do_GET(self):\n"
                 "        self.send_response(200); self.end_headers()\n"
                 "    def log_message(self, *a): pass\n"
                 "h.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")


def test_a_dropped_server_is_still_stopped_at_exit():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = VllmServer([sys.executable, "-c", HEALTH_SERVER, str(port)], port).start(timeout_s=60)
    pid = server.proc.pid
    assert group_members(pid)
    del server
    gc.collect()  # a WeakSet of live servers lost it here, and its processes outlived the CLI
    vllm_engine._stop_all()  # what atexit runs
    assert not group_members(pid), "the server's processes outlived the exit hook"
