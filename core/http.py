"""HTTP to servers the user named: redirects refused, environment proxies and .netrc ignored, errors a user can act on.

The one home of the console's HTTP helpers: the remote engine, the deployment probe and the /metrics scraper all
request through here, so none of them imports another to reach a server.
"""
from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

import requests

from core.errors import NonFiniteAnswer, RemoteError

DEFAULT_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 5.0
# vLLM's HTTP 400 when a response would carry NaN or infinity (logprobs of an overflowed or corrupt forward pass)
VLLM_NONFINITE = "Out of range float values are not JSON compliant"


def normalize_base_url(url: str) -> str:
    """'localhost:8000/v1/' -> 'http://localhost:8000'. Only http(s) with a host is accepted."""
    text = (url or "").strip()
    if not text:
        raise RemoteError("No server URL given. Enter the base URL of the vLLM server, e.g. http://127.0.0.1:8000.")
    if "://" not in text:
        if re.match(r"[A-Za-z][A-Za-z0-9+.-]*:(?!\d)", text):  # javascript:..., mailto:... (not host:port)
            raise RemoteError(f"{url!r} is not an http(s) URL; expected e.g. http://127.0.0.1:8000.")
        text = "http://" + text
    try:
        parts = urlsplit(text)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        raise RemoteError(f"{url!r} is not a valid URL ({exc}); expected e.g. http://127.0.0.1:8000.") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteError(f"{url!r} is not an http(s) URL with a host; expected e.g. http://127.0.0.1:8000.")
    if (why := _bad_host(parts.hostname)) is not None:
        raise RemoteError(f"{url!r} is not a server address: {why}. Expected a host name or IP address and a "
                          "port, e.g. http://127.0.0.1:8000.")
    if parts.query or parts.fragment:
        raise RemoteError(f"{url!r} has a query or fragment; give only the server's base URL.")
    try:
        parts.port  # raises on a non-numeric or out-of-range port
    except ValueError:
        raise RemoteError(f"{url!r} has an invalid port; expected e.g. http://127.0.0.1:8000.") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    return f"{parts.scheme}://{parts.netloc}{path}"


_HOST_NAME = re.compile(r"[\w-]+(\.[\w-]+)*\.?")  # DNS labels ("_" for container names, letters for IDNA)


def _bad_host(host: str) -> str | None:
    """Why `host` (urlsplit's hostname) cannot be a server's address, in plain words; None when it can. Checked
    before any request so that urllib3's parser errors ("Failed to parse: ... contains invalid character") never
    reach a user."""
    if ":" in host:  # an IPv6 address (urlsplit took it from inside [...])
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
            return None
        except ValueError:
            return f"{host!r} is not an IPv6 address"
    if any(c.isspace() for c in host):
        return "it contains a space, and a host name cannot"
    if not _HOST_NAME.fullmatch(host):
        odd = sorted({c for c in host if not re.fullmatch(r"[\w.-]", c)})
        if not odd:
            return f"the host {host!r} has an empty part between dots"
        return f"the host {host!r} has characters a host name cannot have ({', '.join(repr(c) for c in odd)})"
    return None


def new_session() -> requests.Session:
    s = requests.Session()
    s.trust_env = False  # no env proxies or .netrc credentials: talk only to the host the user named
    adapter = requests.adapters.HTTPAdapter(pool_maxsize=64)  # generate()/probe() stream up to 64 requests at once
    s.mount("http://", adapter)
    s.mount("https://", adapter)
    return s


def describe(exc: Exception, url: str, timeout_s: float, service: str = "the vLLM server", check: str = "") -> str:
    """The failed request `url` as a sentence a user can act on. `service` names what was expected there, and
    `check` (optional) says what to verify when it could not be reached at all; without them the sentences are
    about a vLLM server, as most requests are."""
    text = str(exc)
    parts = urlsplit(url)
    where = f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
    unreachable = f"{service[0].upper()}{service[1:]} is not reachable: " if check else ""
    then = f" {check}" if check else ""
    if isinstance(exc, requests.ConnectTimeout):
        return (f"{unreachable}{'c' if check else 'C'}onnecting to {url} timed out after {CONNECT_TIMEOUT_S:g} s."
                + (then or " Check the host and port and any firewall."))
    if isinstance(exc, requests.ReadTimeout) or "Read timed out" in text:
        return (f"{url} accepted the connection but sent no answer within {timeout_s:g} s. {service[0].upper()}"
                f"{service[1:]} may be overloaded or hung, or this port is not an HTTP server.")
    if "Connection refused" in text or "Errno 111" in text:
        if check:
            return f"{unreachable}the connection to {url} was refused: nothing is listening on {where}.{then}"
        return f"Connection to {url} was refused: nothing is listening there. Is {service} running on that port?"
    if "Name or service not known" in text or "nodename nor servname" in text or "getaddrinfo" in text:
        return f"{unreachable}{'t' if check else 'T'}he host in {url} could not be resolved." + (then or " Check the spelling of the URL.")
    if isinstance(exc, (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                        requests.exceptions.InvalidSchema)):
        return (f"{url!r} is not a URL the console can request. Enter the server's base URL, e.g. "
                "http://127.0.0.1:8000.")
    if isinstance(exc, requests.exceptions.SSLError):
        plain = "a plain vLLM server" if service == "the vLLM server" else f"{service} if it serves plain HTTP"
        return f"TLS with {url} failed ({text[:200]}). Use http:// for {plain}."
    if "RemoteDisconnected" in text or "BadStatusLine" in text or "Connection aborted" in text:
        return (f"{url} closed the connection without a valid HTTP answer: {service} dropped it (overloaded or "
                "restarting), or this port is not an HTTP server.")
    return f"Request to {url} failed: {text[:300]}"


def http_get(url: str, timeout_s: float = DEFAULT_TIMEOUT_S, api_key: str | None = None,
             session: requests.Session | None = None) -> requests.Response:
    """GET with the errors a user can act on; refuses redirects (they could point at another host)."""
    return request("GET", url, timeout_s, api_key, session)


def request(method: str, url: str, timeout_s: float, api_key: str | None, session: requests.Session | None,
            *, unauthorized: str = "the server wants an API key (vLLM --api-key). Give the same key here.",
            service: str = "the vLLM server", check: str = "", **kw) -> requests.Response:
    """`unauthorized` finishes the sentence a 401/403 gets: what the server wants, and where to give it. `service`
    and `check` word a failed connection (see describe)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        resp = (session or new_session()).request(method, url, headers=headers, allow_redirects=False,
                                                timeout=(CONNECT_TIMEOUT_S, timeout_s), **kw)
    except requests.RequestException as exc:
        raise RemoteError(describe(exc, url, timeout_s, service, check)) from exc
    if resp.is_redirect or 300 <= resp.status_code < 400:
        resp.close()
        raise RemoteError(f"{url} answered with a redirect to {resp.headers.get('location', '?')!r}; the console "
                          "does not follow redirects. Enter the server's own URL.")
    if resp.status_code in (401, 403):
        resp.close()
        raise RemoteError(f"{url} answered HTTP {resp.status_code}: {unauthorized}")
    return resp


def json_body(resp: requests.Response, url: str, expected: str = "a vLLM OpenAI API") -> dict:
    ctype = resp.headers.get("content-type", "")
    body = resp.text
    if "html" in ctype or body.lstrip().startswith("<"):
        raise RemoteError(f"{url} answered HTTP {resp.status_code} with an HTML page, not JSON: this is a web server "
                          f"or proxy, not {expected}. Enter the base URL of {expected}.")
    try:
        return resp.json()
    except ValueError:
        raise RemoteError(f"{url} answered HTTP {resp.status_code} with something that is not JSON "
                          f"({body[:120]!r}); expected {expected}.") from None


def api_error(resp: requests.Response, url: str) -> RemoteError:
    try:
        msg = resp.json().get("error", {})
        msg = msg.get("message", msg) if isinstance(msg, dict) else msg
    except ValueError:
        msg = resp.text[:300]
    if resp.status_code == 400 and VLLM_NONFINITE in str(msg):
        return NonFiniteAnswer(f"{url} answered HTTP 400: {msg}: the log-probabilities it computed include NaN or "
                               "infinity (an overflowed forward pass or corrupt weights), which vLLM cannot write as "
                               "JSON")
    return RemoteError(f"{url} answered HTTP {resp.status_code}: {msg}")
