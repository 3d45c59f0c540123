"""Host source via psutil: MemAvailable, CPU %, load, swap, disk and network I/O rates, RSS of watched processes.

MemAvailable (/proc/meminfo, psutil `virtual_memory().available`) is read every tick because a leak is judged from
its slope over the window. Everything else is read once a second: CPU % and I/O rates
come from counter deltas, which are noise over 100 ms (the kernel counts CPU time in 10 ms jiffies).
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

try:
    import psutil
except ImportError:  # a console requirement, but keep GPU-only tools (bench on a bare GPU box) importable
    psutil = None

from core.telemetry.base import Availability, FailureLog, Sample

SLOW_PERIOD_S = 1.0
# Finding processes by name walks all of /proc, which costs milliseconds on a busy host: do it rarely.
NAME_RESCAN_S = 10.0

HOST_FIELDS = ("mem_available_bytes", "mem_total_bytes", "cpu_pct", "load1", "load5", "load15", "swap_used_bytes",
               "swap_total_bytes", "disk_read_bytes_s", "disk_write_bytes_s", "net_rx_bytes_s", "net_tx_bytes_s")


def parse_watch(specs: Iterable[str]) -> list[tuple[str, int | str]]:
    """"self", a PID ("1234") or a name fragment ("vllm") -> (label, pid or lowercase pattern)."""
    out: list[tuple[str, int | str]] = []
    for spec in specs:
        spec = spec.strip()
        if not spec:
            continue
        if spec == "self":
            out.append(("console", os.getpid()))
        elif spec.isdigit():
            out.append((f"pid{spec}", int(spec)))
        else:
            out.append((re.sub(r"[^A-Za-z0-9_-]+", "_", spec), spec.lower()))
    return out


class HostSource:
    name = "host"

    def __init__(self, watch: Iterable[str] = ("self",), clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._fail = FailureLog(self.name)
        self.watch_specs = [w.strip() for w in watch if w.strip()]
        self._watch = parse_watch(self.watch_specs)
        self._matches: dict[str, list[Any]] = {}  # label -> psutil.Process list
        self._scan_failed: dict[str, str] = {}  # label -> why its name scan failed
        self._scan_t = -float("inf")
        self._slow_t = -float("inf")
        self._prev: dict[str, tuple[float, Any]] = {}  # counter name -> (time, last counters) for rates
        self._slow_vals: dict[str, Any] = {}
        self._slow_why: dict[str, str] = {}

    def probe(self) -> Availability:
        if psutil is None:
            return Availability(False, "psutil is not installed, so host telemetry is off (pip install psutil).")
        try:
            psutil.virtual_memory()
        except Exception as exc:
            return Availability(False, f"psutil cannot read host memory here: {exc}")
        return Availability(True, "psutil")

    def watch(self, specs: Iterable[str]) -> None:
        """Replace the watched processes; the sampler thread picks the new list up on its next tick."""
        self.watch_specs = [w.strip() for w in specs if w.strip()]
        self._watch = parse_watch(self.watch_specs)
        self._scan_t = -float("inf")
        self._slow_t = -float("inf")

    def sample(self) -> Sample:
        t, now = time.time(), self._clock()
        values: dict[str, Any] = dict.fromkeys(HOST_FIELDS)
        reasons: dict[str, str] = {}
        try:
            vm = psutil.virtual_memory()
            values["mem_available_bytes"], values["mem_total_bytes"] = vm.available, vm.total
        except Exception as exc:
            reasons["mem_available_bytes"] = reasons["mem_total_bytes"] = self._failed("memory", exc)
        if now - self._slow_t >= SLOW_PERIOD_S:
            self._slow_t = now
            try:
                self._slow(now)
            except Exception as exc:  # backstop: sample() never raises
                self._slow_vals, self._slow_why = {}, {f: self._failed("slow", exc) for f in HOST_FIELDS[2:]}
        values.update(self._slow_vals)
        reasons.update(self._slow_why)
        out = {("host." + k if "." not in k else k): v for k, v in values.items()}
        why = {("host." + k if "." not in k else k): r for k, r in reasons.items() if values.get(k) is None}
        return Sample(self.name, t, out, why)

    def _failed(self, what: str, exc: Exception) -> str:
        reason = f"psutil could not read {what}: {exc}"
        self._fail.once(what, reason)
        return reason

    def _slow(self, now: float) -> None:
        vals: dict[str, Any] = {}
        why: dict[str, str] = {}
        # Each read fails alone: an unreadable /proc/stat must not blank load, swap, I/O and the watched processes.
        try:
            cpu = psutil.cpu_times()
        except Exception as exc:
            why["cpu_pct"] = self._failed("CPU times", exc)
        else:
            busy = sum(cpu) - cpu.idle - getattr(cpu, "iowait", 0.0)
            prev = self._prev.get("cpu")
            self._prev["cpu"] = (sum(cpu), busy)
            if prev and sum(cpu) > prev[0]:
                # Sums of float counters: an idle interval can come out a hair below 0 (-1e-10 seen), so clamp.
                vals["cpu_pct"] = min(100.0, max(0.0, 100.0 * (busy - prev[1]) / (sum(cpu) - prev[0])))
            else:
                why["cpu_pct"] = "needs two readings a second apart"
        try:
            vals["load1"], vals["load5"], vals["load15"] = os.getloadavg()
        except OSError as exc:
            why["load1"] = why["load5"] = why["load15"] = self._failed("load", exc)
        try:
            sw = psutil.swap_memory()
            vals["swap_used_bytes"], vals["swap_total_bytes"] = sw.used, sw.total
        except Exception as exc:
            why["swap_used_bytes"] = why["swap_total_bytes"] = self._failed("swap", exc)
        self._rates(now, "disk", psutil.disk_io_counters, ("read_bytes", "write_bytes"),
                    ("disk_read_bytes_s", "disk_write_bytes_s"), vals, why)
        self._rates(now, "net", psutil.net_io_counters, ("bytes_recv", "bytes_sent"),
                    ("net_rx_bytes_s", "net_tx_bytes_s"), vals, why)
        self._processes(now, vals, why)
        self._slow_vals, self._slow_why = vals, why

    def _rates(self, now: float, name: str, read: Callable, attrs: tuple, fields: tuple, vals: dict, why: dict) -> None:
        try:
            counters = read()
        except Exception as exc:
            counters, err = None, self._failed(name + " I/O", exc)
        else:
            err = f"no {name} I/O counters on this host (container or no devices)"
        if counters is None:
            why.update(dict.fromkeys(fields, err))
            return
        prev = self._prev.get(name)
        self._prev[name] = (now, counters)
        if prev is None or now <= prev[0]:
            why.update(dict.fromkeys(fields, "needs two readings a second apart"))
            return
        dt = now - prev[0]
        for attr, field in zip(attrs, fields):
            # Counters can wrap or reset (a NIC going away): a negative delta is not a rate.
            vals[field] = max(0.0, (getattr(counters, attr) - getattr(prev[1], attr)) / dt)

    def _processes(self, now: float, vals: dict, why: dict) -> None:
        if now - self._scan_t >= NAME_RESCAN_S:
            self._scan_t = now
            self._matches, self._scan_failed = self._scan()
        for label, target in self._watch:
            key = f"proc.{label}.rss_bytes"
            if label in self._scan_failed:  # the process list could not be read: unknown, not "none running"
                why[key] = why[f"proc.{label}.count"] = self._scan_failed[label]
                continue
            procs = self._matches.get(label, [])
            rss, alive = 0, []
            for proc in procs:
                try:
                    rss += proc.memory_info().rss
                    alive.append(proc)
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    pass
            self._matches[label] = alive
            vals[f"proc.{label}.count"] = len(alive)
            if alive:
                # RSS summed over matches counts shared pages once per process: an upper bound, fine for a trend.
                vals[key] = rss
            else:
                why[key] = (f"no running process with PID {target}" if isinstance(target, int)
                            else f"no running process whose name or command line contains '{target}'")

    def _scan(self) -> tuple[dict[str, list[Any]], dict[str, str]]:
        """label -> matching processes, and label -> reason for the name watches whose scan failed."""
        found: dict[str, list[Any]] = {}
        failed: dict[str, str] = {}
        patterns = [(label, t) for label, t in self._watch if isinstance(t, str)]
        for label, target in self._watch:
            if isinstance(target, int):
                try:
                    found[label] = [psutil.Process(target)]
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    found[label] = []
        if patterns:
            for label, _ in patterns:
                found[label] = []
            try:
                cmdlines = list(_cmdlines())
            except Exception as exc:
                reason = self._failed("the process list", exc)
                failed = {label: reason for label, _ in patterns}
                cmdlines = []
            for pid, text in cmdlines:
                for label, pattern in patterns:
                    if pattern in text:
                        try:
                            found[label].append(psutil.Process(pid))
                        except (psutil.NoSuchProcess, psutil.AccessDenied):
                            pass
        return found, failed

    def close(self) -> None:
        self._matches, self._scan_failed = {}, {}


def _cmdlines() -> Iterator[tuple[int, str]]:
    """(pid, lowercase command line) of every other process. On Linux this reads /proc/<pid>/cmdline directly:
    psutil.process_iter(["name", "cmdline"]) costs ~10x more (measured 15.7 vs 1.8 ms for 112 processes)."""
    me = os.getpid()
    if os.path.isdir("/proc"):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                try:
                    with open(f"/proc/{entry}/cmdline", "rb") as f:
                        raw = f.read()
                except OSError:  # gone, or not ours to read
                    continue
                if raw:  # kernel threads have none
                    yield int(entry), raw.replace(b"\0", b" ").decode("utf-8", "replace").lower()
        return
    for proc in psutil.process_iter(["name", "cmdline"]):
        if proc.pid != me:
            yield proc.pid, " ".join([proc.info.get("name") or ""] + (proc.info.get("cmdline") or [])).lower()


# --- which processes' resident memory grew over a window -------------------------------------------------------------

RSS_LOOK_EVERY_S = 5.0  # a look at every process costs ~10-40 ms (psutil, a few hundred processes): rarely
GREW_MIN_BYTES = 32 * 2**20  # growth below this is allocator churn, not worth naming


@dataclass(frozen=True)
class ProcessGrowth:
    """One process's resident memory over a window: at its first look (0 for one started inside the window) and
    its last (0 for one that exited)."""

    pid: int
    ppid: int
    name: str  # the command line, cut: "python -m pip install torch"
    first_rss: int
    last_rss: int
    peak_rss: int
    started: bool  # not running at the window's first look
    exited: bool  # gone at its last

    @property
    def growth(self) -> int:
        return self.last_rss - self.first_rss

    def describe(self) -> str:
        how = ", started in the window" if self.started else ", exited since" if self.exited else ""
        return f"{self.name} (pid {self.pid}) {self.growth / 2**20:+.0f} MiB{how}"


class RssWatch:
    """Every process's RSS at the window's first look and then every RSS_LOOK_EVERY_S: which grew, which started.

    The host's MemAvailable only says that memory went; this says to whom, so a leak in the server under test is
    told from another process installing packages or loading a model on the same host."""

    def __init__(self, every_s: float = RSS_LOOK_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.every_s, self._clock = every_s, clock
        self._t = -float("inf")
        self._first: dict[tuple[int, float], tuple[int, int, str]] | None = None  # (pid, created) -> (rss, ppid, name)
        self._seen: dict[tuple[int, float], tuple[int, int, str, int]] = {}  # -> (last rss, ppid, name, peak)
        self._alive: set[tuple[int, float]] = set()
        self.reason = "" if psutil is not None else "psutil is not installed"
        self.looks = 0

    def look(self, force: bool = False) -> None:
        if psutil is None or (not force and self._clock() - self._t < self.every_s):
            return
        self._t = self._clock()
        try:
            table = _rss_table()
        except Exception as exc:  # the process list unreadable here: growth stays unknown, never "none grew"
            self.reason = f"psutil could not list the processes: {exc}"
            return
        self.looks += 1
        if self._first is None:
            self._first = dict(table)
        for key, (rss, ppid, name) in table.items():
            peak = max(rss, self._seen.get(key, (0, 0, "", 0))[3])
            self._seen[key] = (rss, ppid, name, peak)
        self._alive = set(table)

    def growth(self) -> list[ProcessGrowth] | None:
        """Every process that grew by GREW_MIN_BYTES+ (or started that big), largest growth first; None before two
        looks (nothing to compare)."""
        if self._first is None or self.looks < 2:
            return None
        out = []
        for key, (rss, ppid, name, peak) in self._seen.items():
            started, exited = key not in self._first, key not in self._alive
            first = 0 if started else self._first[key][0]
            g = ProcessGrowth(key[0], ppid, name, first, 0 if exited else rss, peak, started, exited)
            if g.growth >= GREW_MIN_BYTES or (exited and peak - first >= GREW_MIN_BYTES):
                out.append(g)
        return sorted(out, key=lambda g: -max(g.growth, g.peak_rss - g.first_rss))

    def table_pids(self) -> dict[int, int]:
        """pid -> ppid of every process seen, to find a server's or the console's descendants."""
        return {key[0]: ppid for key, (_, ppid, _, _) in self._seen.items()}


def _rss_table() -> dict[tuple[int, float], tuple[int, int, str]]:
    out = {}
    for proc in psutil.process_iter(["ppid", "name", "cmdline", "memory_info", "create_time"]):
        info = proc.info
        mem = info.get("memory_info")
        if mem is None:  # not ours to read
            continue
        cmd = " ".join(info.get("cmdline") or []) or info.get("name") or "?"
        out[(proc.pid, info.get("create_time") or 0.0)] = (mem.rss, info.get("ppid") or 0, _short(cmd))
    return out


def _short(cmd: str, limit: int = 60) -> str:
    """A command line cut for a verdict: paths of the interpreter and script shortened to their names."""
    words = [w.rsplit("/", 1)[-1] if i < 2 and "/" in w else w for i, w in enumerate(cmd.split())]
    text = " ".join(words)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def descendants(roots: Iterable[int], parents: dict[int, int]) -> set[int]:
    """The roots and every pid whose parent chain leads to one of them."""
    found = set(roots)
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    return found
