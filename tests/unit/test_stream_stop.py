"""A stop closes a server's event stream at once, even while the server sends nothing (a long prefill): a real local
socket that answers with event-stream headers and then holds the connection open, no vLLM needed."""
from __future__ import annotations

import socket
import threading
import time

from core.engines.base import GenerationParams, RunControl, controlled
from core.engines.remote import RemoteEngine, ServerInfo


def test_a_stop_closes_a_silent_stream_and_the_server_sees_the_disconnect():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    closed = threading.Event()

    def serve():
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        conn.settimeout(30)
        try:
            while conn.recv(1024):  # nothing more is sent; recv returns b"" once the client hangs up
                pass
        except OSError:
            pass
        closed.set()
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    engine = RemoteEngine(url, model="m", timeout_s=30)
    engine._info = ServerInfo(url, ["m"], None, False, None)  # no discovery: the socket speaks only the stream
    t0 = time.monotonic()
    with controlled(RunControl(should_stop=lambda: time.monotonic() - t0 > 0.5)) as control:
        gen = engine.generate(["a long prompt"], GenerationParams(max_new_tokens=4))[0]
    assert gen.finish_reason == "cancelled" and not gen.token_ids and control.stopped_at is not None
    assert closed.wait(10)  # the server side saw the connection close: vLLM aborts the request then
    srv.close()
