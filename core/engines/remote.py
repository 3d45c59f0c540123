"""An OpenAI-compatible server (vLLM) as an Engine: streaming completions timed by the client, token ids, logprobs.

Timings are what a client sees: TTFT is from sending the request to the arrival of the first SSE chunk that
carries a token, ITL the gaps between chunk arrivals (network and HTTP included, unlike the server's histograms).
Token ids come from vLLM's extensions `return_token_ids` (ids of each streamed chunk, plus the prompt's ids) and
`return_tokens_as_token_ids` (top-logprob keys as "token_id:N"); teacher-forced scores from `prompt_logprobs`.
Requests go only to the URL the user gave: redirects are refused and environment proxies/.netrc are ignored.
"""
from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator

import requests

from core.engines.base import Generation, GenerationParams, MemoryReport, Score, StreamEvent, short_ran, stop_probe
from core.errors import InputError, RemoteError
from core.http import DEFAULT_TIMEOUT_S, api_error, describe, json_body, new_session, normalize_base_url, request
from core.precision import KVDtype, Precision


@dataclass
class ServerInfo:
    base_url: str
    models: list[str]
    max_model_len: int | None
    is_vllm: bool  # vLLM marks its models owned_by "vllm" and answers /version
    version: str | None = None
    raw_models: list[dict] = field(default_factory=list)


class StreamStopper:
    """Closes a streaming response from a watcher thread as soon as should_stop() turns true, so a read blocked on a
    server that is still prefilling returns at once; `closed` tells the reader it was a stop."""

    POLL_S = 0.2

    def __init__(self, resp, should_stop: Callable[[], bool] | None):
        self.closed, self._done = threading.Event(), threading.Event()
        if should_stop is not None:
            threading.Thread(target=self._watch, args=(resp, should_stop), daemon=True).start()

    def _watch(self, resp, should_stop) -> None:
        while not self._done.wait(self.POLL_S):
            if should_stop():
                self.closed.set()
                # close() alone does not wake a read blocked in another thread; shutting the socket down does
                sock = getattr(getattr(resp.raw, "_connection", None), "sock", None)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                resp.close()
                return

    def done(self) -> None:
        self._done.set()


def _float_or_nan(value) -> float:
    """A logprob from JSON: a server's NaN (an overflowed forward pass) arrives as null; anything that is not a number
    counts as not finite too, and the agreement summary reports it as such."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def _token_key(key: str) -> int:
    # return_tokens_as_token_ids gives "token_id:123"
    return int(key.rsplit(":", 1)[1]) if ":" in key else int(key)


class RemoteEngine:
    """An OpenAI-compatible completion server. Its precision is whatever it was started with."""

    name = "remote"

    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.base_url = normalize_base_url(base_url)
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._session = new_session()
        self._model = model
        self._info: ServerInfo | None = None

    # --- server discovery -------------------------------------------------------------------------------------
    def connect(self) -> ServerInfo:
        """List the served models and check this is an OpenAI-compatible server (raises RemoteError otherwise)."""
        url = self.base_url + "/v1/models"
        resp = request("GET", url, self.timeout_s, self.api_key, self._session)
        if resp.status_code == 404:
            body = resp.text.lstrip()
            page = " with an HTML page" if body.startswith("<") else ""
            raise RemoteError(f"{url} answered HTTP 404{page}: the server at {self.base_url} is not an "
                              "OpenAI-compatible API (vLLM serves /v1/models). Check the port, and give the base "
                              "URL without a path.")
        data = json_body(resp, url)
        if resp.status_code != 200:
            raise api_error(resp, url)
        if not isinstance(data, dict) or not isinstance(data.get("data"), list):
            raise RemoteError(f"{url} answered JSON without a 'data' list of models; not an OpenAI-compatible API.")
        raw = [m for m in data["data"] if isinstance(m, dict) and m.get("id")]
        if not raw:
            raise RemoteError(f"{self.base_url} serves no models.")
        is_vllm = any(m.get("owned_by") == "vllm" for m in raw)
        version = None
        try:
            v = request("GET", self.base_url + "/version", min(self.timeout_s, 5.0), self.api_key, self._session)
            body = v.json() if v.status_code == 200 and "json" in v.headers.get("content-type", "") else None
            if isinstance(body, dict) and body.get("version") is not None:
                version = str(body["version"])
                is_vllm = True
        except (RemoteError, ValueError):
            pass
        models = [m["id"] for m in raw]
        if self._model is None or self._model not in models:
            if self._model is not None:
                raise RemoteError(f"{self.base_url} does not serve model {self._model!r}; it serves {models}.")
            self._model = models[0]
        lens = [m.get("max_model_len") for m in raw if m["id"] == self._model]
        self._info = ServerInfo(self.base_url, models, lens[0] if lens and isinstance(lens[0], int) else None,
                                is_vllm, version, raw)
        return self._info

    @property
    def info(self) -> ServerInfo:
        return self._info or self.connect()

    @property
    def model(self) -> str:
        if self._info is None:
            self.connect()
        return self._model  # type: ignore[return-value]

    def models(self) -> list[str]:
        return self.connect().models

    @property
    def ran(self) -> str:
        info = self._info
        kind = f"vLLM {info.version or ''}".rstrip() if info and info.is_vllm else "OpenAI-compatible"
        return f"{kind} server at {self.base_url}"

    @property
    def ran_short(self) -> str:
        return short_ran(self.ran)  # "vLLM 0.32.0 server · host:8000"

    def unsupported_reasons(self, precision: Precision, kv_dtype: KVDtype) -> list[str]:
        """A running server's precision is fixed by its launch flags; only its KV dtype can be read (/metrics)."""
        if kv_dtype is KVDtype.AUTO:
            return []
        from core.telemetry.vllm_metrics import MetricsError, scrape

        try:
            cache_dtype = scrape(self.base_url, api_key=self.api_key).cache_dtype
        except (RemoteError, MetricsError):
            return []
        if cache_dtype is not None and not cache_dtype.startswith("fp8"):
            return [f"The server at {self.base_url} runs its KV cache as {cache_dtype!r} (vllm:cache_config_info); "
                    "an FP8 KV cache needs the server restarted with --kv-cache-dtype fp8."]
        return []

    def tokenize(self, text: str) -> list[int]:
        """vLLM's /tokenize (with the model's special tokens, as a completion request adds them)."""
        url = self.base_url + "/tokenize"
        resp = request("POST", url, self.timeout_s, self.api_key, self._session,
                        json={"model": self.model, "prompt": text})
        data = json_body(resp, url)
        if resp.status_code != 200 or "tokens" not in data:
            raise RemoteError(f"{url} did not tokenize (HTTP {resp.status_code}); /tokenize is a vLLM endpoint.")
        return list(data["tokens"])

    # --- generation -------------------------------------------------------------------------------------------
    def _completion_body(self, prompt: str | list[int], params: GenerationParams, stream: bool) -> dict:
        p = params.validated()
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "stream": stream,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "ignore_eos": not p.stop_at_eos,
        }
        if p.top_logprobs:
            body["logprobs"] = p.top_logprobs
        if p.seed is not None:
            body["seed"] = p.seed
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _stream_one(self, prompt: str | list[int], params: GenerationParams,
                    on_token: Callable[[Generation, list[int]], None] | None = None,
                    should_stop: Callable[[], bool] | None = None) -> Generation:
        url = self.base_url + "/v1/completions"
        body = self._completion_body(prompt, params, stream=True)
        t0 = time.perf_counter()
        resp = request("POST", url, self.timeout_s, self.api_key, self._session, json=body, stream=True)
        gen = Generation(prompt_ids=list(prompt) if isinstance(prompt, list) else [])
        # A stop closes the connection at once, even mid-prefill with no chunk arriving: the server then aborts the
        # request (vLLM frees its slot and KV blocks on a client disconnect).
        watch = StreamStopper(resp, should_stop)
        try:
            if resp.status_code != 200:
                json_body(resp, url)  # raises on HTML
                raise api_error(resp, url)
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                raise RemoteError(f"{url} did not answer with an event stream (content-type "
                                  f"{resp.headers.get('content-type')!r}); not a streaming OpenAI server.")
            for raw in resp.iter_lines(chunk_size=None, decode_unicode=False):
                now = time.perf_counter() - t0
                if now > self.timeout_s * 10:
                    raise RemoteError(f"{url} kept streaming for more than {self.timeout_s * 10:g} s; stopped.")
                if not raw or not raw.startswith(b"data:"):
                    continue
                payload = raw[5:].strip()
                if payload == b"[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    err = chunk["error"]
                    raise RemoteError(f"{url} reported an error mid-stream: {err.get('message', err) if isinstance(err, dict) else err}")
                for choice in chunk.get("choices") or []:
                    if choice.get("prompt_token_ids") and not gen.prompt_ids:
                        gen.prompt_ids = list(choice["prompt_token_ids"])
                    new_ids = choice.get("token_ids")
                    if new_ids is None and choice.get("text"):
                        raise RemoteError(f"{url} streamed text without token ids: the server does not support "
                                          "vLLM's return_token_ids, so token-level agreement cannot be measured.")
                    new_ids = list(new_ids or [])
                    # Tokens that arrive in one chunk share its arrival time (vLLM's --stream-interval > 1).
                    gen.token_ids += new_ids
                    gen.token_times += [now] * len(new_ids)
                    gen.text += choice.get("text") or ""
                    lp = choice.get("logprobs") or {}
                    gen.logprobs += [_float_or_nan(x) for x in lp.get("token_logprobs") or []]
                    gen.top_logprobs += [{_token_key(k): _float_or_nan(v) for k, v in (d or {}).items()}
                                         for d in lp.get("top_logprobs") or []]
                    if choice.get("finish_reason"):
                        gen.finish_reason = "eos" if choice["finish_reason"] == "stop" else choice["finish_reason"]
                    if new_ids and on_token:
                        on_token(gen, new_ids)
                if should_stop and should_stop():
                    gen.finish_reason = "cancelled"
                    break
        except (requests.RequestException, AttributeError, ValueError) as exc:
            if watch.closed.is_set():  # the stream was closed under the read: a stop, not a failure
                gen.finish_reason = "cancelled"
                return gen
            if isinstance(exc, json.JSONDecodeError):
                raise RemoteError(f"{url} sent a malformed event-stream chunk ({exc}); not a vLLM server?") from exc
            if not isinstance(exc, requests.RequestException):
                raise
            raise RemoteError(describe(exc, url, self.timeout_s)) from exc
        finally:
            watch.done()
            resp.close()
        if watch.closed.is_set():
            gen.finish_reason = "cancelled"
        return gen

    def stream_completion(self, prompt: str | list[int], params: GenerationParams,
                          should_stop: Callable[[], bool] | None = None) -> Generation:
        """One streamed completion, timed from sending the request; RemoteError when it fails."""
        return self._stream_one(prompt, params, should_stop=stop_probe(should_stop))

    def generate(self, prompts: list[str], params: GenerationParams,
                 on_step: Callable[[StreamEvent], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> list[Generation]:
        """All prompts are sent at once (the server batches them), each as its own streamed request.

        on_step gets one event per arriving chunk: the sequence that advanced has its new token, the others None.
        """
        params.validated()
        should_stop = stop_probe(should_stop)  # here: the worker threads below do not see the caller's RunControl
        lock = threading.Lock()
        step = [0]
        texts = [""] * len(prompts)
        t0 = time.perf_counter()

        def run(i: int, prompt: str) -> Generation:
            def on_token(gen: Generation, new_ids: list[int]) -> None:
                with lock:
                    texts[i] = gen.text
                    ids: list[int | None] = [None] * len(prompts)
                    ids[i] = new_ids[-1]
                    step[0] += 1
                    on_step(StreamEvent(step[0], ids, list(texts), time.perf_counter() - t0))
            return self._stream_one(prompt, params, on_token if on_step else None, should_stop)

        if len(prompts) == 1:
            return [run(0, prompts[0])]
        with ThreadPoolExecutor(max_workers=min(len(prompts), 64)) as pool:
            return list(pool.map(run, range(len(prompts)), prompts))

    def stream(self, prompt: str, params: GenerationParams) -> Iterator[StreamEvent]:
        """Events as chunks arrive; a background thread reads the stream so the caller can stop early."""
        import queue

        q: queue.Queue = queue.Queue()
        stop = threading.Event()

        def work() -> None:
            try:
                self.generate([prompt], params, on_step=q.put, should_stop=stop.is_set)
                q.put(None)
            except Exception as exc:  # handed to the consumer
                q.put(exc)

        threading.Thread(target=work, daemon=True).start()
        try:
            while (item := q.get()) is not None:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            stop.set()

    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_k: int = 8) -> Score:
        """Teacher-forced: send prompt+continuation as token ids and read vLLM's prompt_logprobs for the tail."""
        if not continuation_ids:
            return Score([], [], [])
        if not 1 <= top_k <= 20:
            raise InputError(f"top_k must be between 1 and 20 (vLLM's default max_logprobs); got {top_k}.")
        url = self.base_url + "/v1/completions"
        ids = list(prompt_ids) + list(continuation_ids)
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": top_k, "add_special_tokens": False}
        resp = request("POST", url, self.timeout_s, self.api_key, self._session, json=body)
        data = json_body(resp, url)
        if resp.status_code != 200:
            raise api_error(resp, url)
        try:
            plp = data["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError):
            plp = None
        if not isinstance(plp, list) or len(plp) != len(ids):
            raise RemoteError(f"{url} returned no usable prompt_logprobs (a vLLM extension), so teacher-forced "
                              "scoring is not possible on this server.")
        target, tops = [], []
        try:
            for pos, tok in zip(plp[len(prompt_ids):], continuation_ids):
                entries = {int(k): v for k, v in (pos or {}).items()}
                # vLLM adds the actual prompt token to each position's dict; keep the server's own top-k (rank <= k).
                tops.append({k: _float_or_nan(e["logprob"]) for k, e in entries.items()
                             if e.get("rank") is not None and e["rank"] <= top_k})
                target.append(_float_or_nan(entries[tok]["logprob"]) if tok in entries else float("nan"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RemoteError(f"{url} returned prompt_logprobs in a shape this console does not know ({exc!r}); "
                              "teacher-forced scoring needs vLLM's {token id: {logprob, rank}} per position.") from exc
        return Score(list(continuation_ids), target, tops)

    def score_many(self, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
        """Teacher-forced scores of several pairs, as parallel requests: the server batches them as they arrive."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(8, len(items))) as pool:
            return list(pool.map(lambda it: self.score(it[0], it[1], top_k), items))

    def memory_report(self) -> MemoryReport:
        """What the server says about itself: KV cache size from cache_config_info, RSS from process metrics."""
        from core.telemetry.vllm_metrics import scrape

        snap = scrape(self.base_url, api_key=self.api_key)
        kv = snap.cache_config.get("kv_cache_memory_bytes")
        return MemoryReport(
            weights_by_dtype={},
            kv_cache_bytes=int(kv) if kv and kv.isdigit() else 0,
            peak_bytes=int(snap.process_rss_bytes) if snap.process_rss_bytes else None,
            peak_source="server API process RSS (vLLM /metrics process_resident_memory_bytes; workers not included)",
            device=f"remote: {self.base_url}",
        )

    def unload(self) -> None:
        self._session.close()
