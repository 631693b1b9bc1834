"""The daemon's HTTP endpoints with random methods, paths, query strings and headers.

The app is the real one (radixjobs.server.http.make_app) on a Daemon with no database owners, driven
in-process through httpx's ASGI transport, which re-raises anything the app raises: never a 500, never a
traceback; /status and /metrics stay the same bounded documents whatever the request carries; a Host other
than the allowed ones gets 421 whatever else the request is.
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given, reject
from hypothesis import strategies as st

from radixjobs.server import Daemon, DaemonConfig
from radixjobs.server.hosts import AllowedHosts
from radixjobs.server.http import make_app
from tests.fuzz import fuzz_settings

STATUS_KEYS = {"node", "uptime_s", "version", "databases", "counters", "running_attempts", "last_error",
               "clusters"}
ROUTES = ("status", "metrics", "healthz")
ALLOWED = AllowedHosts.default("127.0.0.1")  # make_app's default
METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND", "get", "X" * 40]
SEGMENTS = [*ROUTES, "", ".", "..", "%2e%2e", "STATUS", "status.json", "metrics;x", "%00", "%ff", "%2F", "//",
            "~", "a" * 300, "é", "?", "#", "..%2f..%2fetc%2fpasswd"]
TOKEN = st.text(string.ascii_letters + string.digits + "-_", min_size=1, max_size=20)
VALUE = st.text(string.printable.replace("\r", "").replace("\n", "").replace("\x0b", "").replace("\x0c", ""),
                max_size=200)


class Client:
    """Requests to the app on one event loop of its own (the ASGI transport is async)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.daemon = Daemon(DaemonConfig(dsn="host=/nonexistent", node_id="fuzz-node", all_databases=True))
        self.daemon.reachable = True  # as after a look at a reachable cluster: /healthz is ready (200)
        transport = httpx.ASGITransport(app=make_app(self.daemon), raise_app_exceptions=True)
        self.http = httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:7317")

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self.loop.run_until_complete(self.http.request(method, f"http://127.0.0.1:7317{path}", **kwargs))

    def close(self) -> None:
        self.loop.run_until_complete(self.http.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    client = Client()
    yield client
    client.close()


@pytest.fixture(scope="module")
def metric_series(client: Client) -> int:
    return _series(client.request("GET", "/metrics").text)


def _series(text: str) -> int:
    return len([line for line in text.splitlines() if line and not line.startswith("#")])


paths = st.one_of(
    st.sampled_from(ROUTES).map(lambda r: f"/{r}"),
    st.lists(st.one_of(st.sampled_from(SEGMENTS), st.text(max_size=10).map(lambda s: quote(s, safe=""))),
             min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts)),
)
queries = st.dictionaries(st.one_of(TOKEN, st.sampled_from(["node", "format", "limit", "job", "name[]"])),
                          st.one_of(VALUE, st.sampled_from(["' OR 1=1 --", "../../", "%00", "1e309"])), max_size=5)
headers = st.dictionaries(st.one_of(TOKEN, st.sampled_from(["Accept", "Content-Type", "Host", "X-Forwarded-For",
                                                             "Accept-Encoding", "Range", "Authorization"])),
                          VALUE, max_size=6)
bodies = st.one_of(st.none(), st.binary(max_size=300), st.sampled_from([b"{", b'{"a": 1}', b"\x00" * 50]))


@fuzz_settings()
@given(st.sampled_from(METHODS), paths, queries, headers, bodies)
def test_any_request(client: Client, metric_series: int, method: str, path: str, query: dict[str, str],
                     header: dict[str, str], body: bytes | None) -> None:
    try:
        response = client.request(method, path, params=query, headers=header, content=body)
    except httpx.InvalidURL:  # refused by the client (e.g. a control character after "#"): never sent
        reject()
    assert response.status_code < 500, (method, path, response.status_code, response.text[:500])
    assert "Traceback" not in response.text
    if not ALLOWED.allows(response.request.headers.get("host")):  # a Host of the fuzzer's: 421, nothing else
        assert response.status_code == 421, (header, response.status_code)
        return
    assert response.status_code != 421, (header, response.request.headers.get("host"))
    sent = response.request.url.path  # as httpx normalised it ("/status/." is "/status/")
    route = sent.removeprefix("/")
    if route not in ROUTES or method.upper() not in ("GET", "HEAD"):
        # 307: starlette's redirect of "/status/" to "/status"; anything else is refused (the console's
        # pages: 401, or 303 to its login form, or 429 for a bearer token while wrong ones are throttled;
        # its login form and static files are public)
        if route == "login" or route.startswith("static/"):
            return
        assert response.status_code in (303, 307, 400, 401, 403, 404, 405, 429), (method, path, sent,
                                                                             response.status_code)
        assert response.status_code != 303 or response.headers["location"] == "/login"
        return
    assert response.status_code == 200
    if method.upper() == "HEAD":
        return
    assert len(response.content) < 20_000
    if route == "status":
        assert set(json.loads(response.text)) == STATUS_KEYS
    elif route == "metrics":
        assert _series(response.text) == metric_series  # fixed, whatever the request
    else:
        assert response.text == "ok"
