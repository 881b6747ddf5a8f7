"""The retrieval service: Search-R1's `POST /retrieve` and JADE/M-ASK's `POST /search` over any `Retriever`.

Search-R1 (and verl's copy of its server): `{"queries": [str], "topk": int|null, "return_scores": bool}` ->
`{"result": [[{"document": {"id", "contents"}, "score"}]]}`, or with return_scores false the bare document dicts
(upstream's handler breaks in that mode; here both work). JADE/M-ASK `RetrievalTool`: `{"questions": [str],
"N": int}` -> `[{"top_k_docs": [contents, ...]}]`, one object per question.

Requests from concurrent clients are queued and run as one `batch_search` (one encoder batch for dense
retrieval); a request over a limit gets a 422 naming the limit. What guards the service (docs/security.md):

- one bad request fails only itself: a merged batch that raises is rerun request by request, and text the encoder
  cannot take (a lone surrogate) is refused up front with a 422;
- a body over `ServiceLimits.max_body_bytes` (derived from the request limits) is refused with 413 before it is
  parsed; a client that stalls in its headers or body is cut off after `header_timeout_s` / `body_timeout_s`;
- types are strict (no `true` or `"7"` for an int, no NaN), and a 422 lists at most ten errors without echoing
  the input;
- an optional bearer token (required by `serve` on any address but loopback), trusted Host names, and no
  `/docs` or `/openapi.json` unless asked.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictInt, StrictStr

from ragteam.retrieval.base import Hit, Retriever
from ragteam.retrieval.client import TOKEN_ENV, is_loopback

log = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")  # the Host names a loopback-bound service answers to
MAX_ERRORS = 10                         # errors listed in one 422
MAX_LOC_CHARS = 64                      # a location element (a field name a client chose) is cut to this
MIN_BODY_RATE = 256 * 1024              # bytes a second a body must at least arrive at (on top of body_timeout_s)


@dataclass(frozen=True)
class ServiceLimits:
    max_queries: int = 512        # queries in one request
    max_query_chars: int = 2000   # characters in one query
    max_topk: int = 100
    default_topk: int = 3         # Search-R1's server default (--topk 3) when a request sends topk null
    max_batch: int = 1024         # queries merged into one batch_search call
    max_results: int = 10_240     # queries x topk in one request (the size of the answer)
    header_timeout_s: float = 10.0   # each request's headers must arrive within this (the first, and after a reply)
    body_timeout_s: float = 10.0     # its body within this, plus one second per MIN_BODY_RATE bytes
    max_connections: int = 1024      # open connections (or running requests) before new requests get 503
    max_connections_per_client: int = 256   # open connections from one address; more are closed at once

    @property
    def max_body_bytes(self) -> int:
        """The largest body a valid request can need: every query at its longest, each character written as a
        JSON escape (`\\uXXXX`, 6 bytes), plus room for the keys and separators. Anything larger is refused
        before it is read."""
        return self.max_queries * (self.max_query_chars * 6 + 8) + 4096


@dataclass(frozen=True)
class Exposure:
    """Who may talk to the service: a bearer token (None: anyone who can reach it), the Host names it answers to
    (None: any; bound beyond loopback `serve` sets them), and whether the OpenAPI docs are served."""
    token: Optional[str] = None
    allowed_hosts: Optional[tuple[str, ...]] = None
    docs: bool = False


class RetrieveRequest(BaseModel):
    """Search-R1's QueryRequest, with strict types (`topk: true` or `"7"` is an error, not 1 or 7)."""

    model_config = ConfigDict(extra="forbid")
    queries: list[StrictStr]
    topk: StrictInt | None = None
    return_scores: StrictBool = False


class SearchRequest(BaseModel):
    """JADE / M-ASK RetrievalTool payload."""

    model_config = ConfigDict(extra="forbid")
    questions: list[StrictStr]
    N: StrictInt | None = None


class QueryRejected(Exception):
    """The retriever raised on this request alone, while the requests batched with it were served."""


def _unencodable_at(text: str) -> int | None:
    """The position of the first character UTF-8 cannot encode (a lone surrogate such as "\\ud800", which JSON
    allows), or None. Tokenizers raise on such text, so it is refused before it reaches a batch."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _limit_errors(field: str, queries: list[str], k_field: str, k: int, limits: ServiceLimits) -> list[dict]:
    """FastAPI-shaped 422 details; each message names the limit that was broken and the offending value."""
    errs = []

    def err(loc, msg, limit, value):
        errs.append({"loc": ["body", *loc], "msg": msg, "type": "limit_exceeded", "limit": limit, "value": value})

    if not queries:
        err([field], f"'{field}' is empty: send at least one query", "min_queries", 0)
    if len(queries) > limits.max_queries:
        err([field], f"{len(queries)} queries in one request exceed max_queries={limits.max_queries}",
            "max_queries", len(queries))
    bad = 0
    for i, q in enumerate(queries):
        if not q.strip():
            err([field, i], f"query {i} is empty or whitespace", "min_query_chars", 0)
        elif (bad_at := _unencodable_at(q)) is not None:
            err([field, i], f"query {i} is not valid Unicode text: a lone surrogate at character {bad_at}",
                "unicode_text", bad_at)
        elif len(q) > limits.max_query_chars:
            err([field, i], f"query {i} has {len(q)} characters, over max_query_chars={limits.max_query_chars}",
                "max_query_chars", len(q))
        else:
            continue
        bad += 1
        if bad == 10:  # enough to show the problem; a 10k-query request must not get a 10k-line answer
            break
    if not 1 <= k <= limits.max_topk:
        shown = k if abs(k) < 10**9 else f"{str(k)[:10]}..."   # a 4,000-digit int is not echoed
        err([k_field], f"{k_field}={shown} is outside 1..{limits.max_topk} (max_topk={limits.max_topk})", "max_topk",
            shown)
    elif len(queries) * k > limits.max_results:
        err([k_field], f"{len(queries)} queries x {k_field}={k} = {len(queries) * k} results, over max_results="
                       f"{limits.max_results}", "max_results", len(queries) * k)
    return errs


class MicroBatcher:
    """Merges the queries of requests waiting at the same moment into one `batch_search` per distinct k.

    No timer: while one batch runs, new requests queue up and all of them form the next batch, so a lone
    request pays no extra latency and a crowd is served in big encoder/searcher batches. A merged batch that
    raises is rerun request by request, so one request the retriever cannot take fails alone (`QueryRejected`)
    and the others are served.
    """

    def __init__(self, retriever: Retriever, max_batch: int):
        self.retriever, self.max_batch = retriever, max_batch
        self.queue: asyncio.Queue = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")  # engines thread inside
        self.task: asyncio.Task | None = None
        self.batches = 0  # number of batch_search calls, for tests and /health
        self.isolated = 0  # merged batches that failed and were rerun request by request

    async def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put((queries, k, fut))
        return await fut

    async def _batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        res = await asyncio.get_running_loop().run_in_executor(self.executor, self.retriever.batch_search,
                                                               queries, k)
        self.batches += 1
        return res

    async def _serve_group(self, k: int, group: list) -> None:
        flat = [q for qs, _, _ in group for q in qs]
        try:
            res = await self._batch(flat, k)
        except Exception as e:  # noqa: BLE001 - whose fault it is is decided below, request by request
            if len(group) == 1:
                _settle(group[0][2], exc=e)
                return
            self.isolated += 1
            log.warning("a merged batch of %d requests failed (%s); rerunning them one by one", len(group),
                        type(e).__name__)
            outcomes = []
            for qs, _, _ in group:
                try:
                    outcomes.append((await self._batch(qs, k), None))
                except Exception as one:  # noqa: BLE001
                    outcomes.append((None, one))
            served = any(exc is None for _, exc in outcomes)
            for (_, _, fut), (hits, exc) in zip(group, outcomes):
                if exc is None:
                    _settle(fut, result=hits)
                else:  # the others went through: this request is what the retriever cannot take
                    _settle(fut, exc=QueryRejected(type(exc).__name__) if served else exc)
            return
        pos = 0
        for qs, _, fut in group:
            _settle(fut, result=res[pos:pos + len(qs)])
            pos += len(qs)

    async def run(self) -> None:
        while True:
            items = [await self.queue.get()]
            n = len(items[0][0])
            while n < self.max_batch and not self.queue.empty():
                items.append(self.queue.get_nowait())
                n += len(items[-1][0])
            by_k: dict[int, list] = defaultdict(list)
            for it in items:
                by_k[it[1]].append(it)
            for k, group in by_k.items():
                try:
                    await self._serve_group(k, group)
                except Exception as e:  # noqa: BLE001 - e.g. a result that cannot be split: fail these, keep serving
                    log.exception("a batch failed outside the retriever")
                    for _, _, fut in group:
                        _settle(fut, exc=e)


def _settle(fut: asyncio.Future, *, result=None, exc: BaseException | None = None) -> None:
    if fut.done():  # the client went away
        return
    if exc is None:
        fut.set_result(result)
    else:
        fut.set_exception(exc)


def _doc(h: Hit) -> dict:
    return {"id": h.id, "contents": h.contents}


def _error_list(errors: list[dict]) -> list[dict]:
    """At most MAX_ERRORS of pydantic's errors, each as loc/msg/type only: never the input (which may be huge, or
    NaN that JSON cannot carry back), and each location element cut to MAX_LOC_CHARS."""
    out = []
    for e in errors[:MAX_ERRORS]:
        loc = [x if isinstance(x, int) else str(x)[:MAX_LOC_CHARS] for x in e.get("loc", ())]
        out.append({"loc": loc, "msg": str(e.get("msg", ""))[:200], "type": str(e.get("type", ""))[:64]})
    return out


def _json_error(status: int, detail, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


class _Guard:
    """ASGI middleware in front of every route: the bearer token (one Authorization header), then the body, read here
    in full but never past `limits.max_body_bytes` (a Content-Length over it is refused before a byte is read) nor
    past one deadline (`body_timeout_s` plus a second per MIN_BODY_RATE bytes), then replayed to the app."""

    def __init__(self, app, limits: ServiceLimits, token: Optional[str]):
        self.app, self.limits = app, limits
        self.token = None if token is None else token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        auths = [v for k, v in scope["headers"] if k == b"authorization"]
        if len(auths) > 1:   # proxies disagree on which one counts: refuse rather than pick
            return await _json_error(400, "more than one Authorization header")(scope, receive, send)
        if self.token is not None and not _bearer_ok(headers.get(b"authorization", b""), self.token):
            return await _json_error(401, "a bearer token is required (Authorization: Bearer <token>)",
                                     {"WWW-Authenticate": "Bearer"})(scope, receive, send)
        cap = self.limits.max_body_bytes
        length = headers.get(b"content-length")
        if length is not None:
            if not length.isdigit():
                return await _json_error(400, "Content-Length is not a number")(scope, receive, send)
            if int(length) > cap:
                return await _json_error(413, f"the body has {int(length)} bytes, over max_body_bytes={cap} (set "
                                              f"by max_queries and max_query_chars)")(scope, receive, send)
        # one deadline for the whole body, not one per chunk (a byte every few seconds must not hold the slot):
        # body_timeout_s plus a second per MIN_BODY_RATE bytes announced or, chunked, received so far
        loop = asyncio.get_running_loop()
        start, announced = loop.time(), int(length) if length is not None else 0
        chunks, size, more = [], 0, True
        while more:
            left = start + self.limits.body_timeout_s + max(announced, size) / MIN_BODY_RATE - loop.time()
            try:
                msg = await asyncio.wait_for(receive(), timeout=max(left, 0.001))
            except asyncio.TimeoutError:
                return await _json_error(408, f"the body did not arrive in time (body_timeout_s="
                                              f"{self.limits.body_timeout_s} plus a second per {MIN_BODY_RATE} "
                                              f"bytes)")(scope, receive, send)
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > cap:
                return await _json_error(413, f"the body is over max_body_bytes={cap} (set by max_queries and "
                                              f"max_query_chars)")(scope, receive, send)
            chunks.append(body)
            more = msg.get("more_body", False)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()

        return await self.app(scope, replayed, send)


def _bearer_ok(header: bytes, token: bytes) -> bool:
    scheme, _, given = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


def create_app(retriever: Retriever, limits: ServiceLimits = ServiceLimits(), *, name: str = "",
               exposure: Exposure = Exposure()) -> FastAPI:
    batcher = MicroBatcher(retriever, limits.max_batch)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        # a fresh queue and thread each time the app starts: the same app may be served again (tests do)
        batcher.queue = asyncio.Queue()
        batcher.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")
        batcher.task = asyncio.create_task(batcher.run())
        yield
        batcher.task.cancel()
        batcher.executor.shutdown(wait=False, cancel_futures=True)

    docs = dict(docs_url="/docs", redoc_url="/redoc", openapi_url="/openapi.json") if exposure.docs else \
        dict(docs_url=None, redoc_url=None, openapi_url=None)
    app = FastAPI(title="ragteam retrieval service", lifespan=lifespan, **docs)
    app.state.batcher = batcher
    app.add_middleware(_Guard, limits=limits, token=exposure.token)
    if exposure.allowed_hosts is not None:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(exposure.allowed_hosts))  # outermost

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        return JSONResponse({"detail": _error_list(list(errors)), "errors": len(errors)}, status_code=422)

    def reject(errs):
        return JSONResponse({"detail": errs[:MAX_ERRORS]}, status_code=422)

    async def run(queries: list[str], k: int, field_name: str):
        """The hits, or the response that says why there are none."""
        try:
            return await batcher.search(queries, k), None
        except QueryRejected as e:
            return None, reject([{"loc": ["body", field_name], "type": "retriever_rejected", "limit": None,
                                  "msg": f"the retriever could not take this request ({e}); the requests batched "
                                         f"with it were served", "value": None}])
        except Exception as e:  # noqa: BLE001 - the server's fault: say so without echoing anything
            log.exception("retrieval failed")
            return None, _json_error(500, f"retrieval failed ({type(e).__name__})")

    @app.post("/retrieve", openapi_extra=_body_schema(RetrieveRequest))
    async def retrieve(request: Request):
        req, bad = await _read(request, RetrieveRequest, "queries", limits)
        if bad is not None:
            return bad
        k = limits.default_topk if req.topk is None else req.topk
        if errs := _limit_errors("queries", req.queries, "topk", k, limits):
            return reject(errs)
        results, failed = await run(req.queries, k, "queries")
        if failed is not None:
            return failed
        if req.return_scores:
            body = [[{"document": _doc(h), "score": _finite(h.score)} for h in hits] for hits in results]
        else:
            body = [[_doc(h) for h in hits] for hits in results]
        return JSONResponse({"result": body})

    @app.post("/search", openapi_extra=_body_schema(SearchRequest))
    async def search(request: Request):
        req, bad = await _read(request, SearchRequest, "questions", limits)
        if bad is not None:
            return bad
        k = limits.default_topk if req.N is None else req.N
        if errs := _limit_errors("questions", req.questions, "N", k, limits):
            return reject(errs)
        results, failed = await run(req.questions, k, "questions")
        if failed is not None:
            return failed
        return JSONResponse([{"top_k_docs": [h.contents for h in hits]} for hits in results])

    @app.get("/health")
    async def health():
        alive = batcher.task is not None and not batcher.task.done()
        return {"status": "ok" if alive else "failed: the batcher stopped (restart the service)",
                "retriever": name or type(retriever).__name__, "batches": batcher.batches,
                "isolated_batches": batcher.isolated,
                "limits": {**asdict(limits), "max_body_bytes": limits.max_body_bytes}}

    return app


def _body_schema(model: type[BaseModel]) -> dict:
    """The request body as OpenAPI documents it (the routes read and validate the body themselves: `_read`)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


async def _read(request: Request, model: type[BaseModel], list_field: str, limits: ServiceLimits):
    """(the validated request, None) or (None, the 4xx that says why not). The cheap checks come before pydantic
    sees the body: a JSON object, no more keys than the model has, the list no longer than `max_queries`. A body
    of a million items under the size cap is refused by its length, not validated item by item (which took 34 s
    and 3.7 GB for 3M integers); pydantic's errors are read without their input."""
    import json

    from pydantic import ValidationError

    raw = await request.body()
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, JSONResponse({"detail": [{"loc": ["body"], "msg": f"not JSON: {type(e).__name__}",
                                               "type": "json_invalid"}]}, status_code=422)
    except RecursionError:
        return None, _json_error(400, "the JSON is nested too deeply")
    if not isinstance(data, dict):
        return None, JSONResponse({"detail": [{"loc": ["body"], "msg": "the body must be a JSON object",
                                               "type": "model_attributes_type"}]}, status_code=422)
    extra = [k for k in data if k not in model.model_fields]
    if extra:
        return None, JSONResponse({"detail": [{"loc": ["body", str(k)[:MAX_LOC_CHARS]],
                                               "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
                                              for k in extra[:MAX_ERRORS]], "errors": len(extra)}, status_code=422)
    items = data.get(list_field)
    if isinstance(items, list) and len(items) > limits.max_queries:
        return None, JSONResponse({"detail": [{
            "loc": ["body", list_field], "type": "limit_exceeded", "limit": "max_queries", "value": len(items),
            "msg": f"{len(items)} queries in one request exceed max_queries={limits.max_queries}"}]}, status_code=422)
    try:
        return model.model_validate(data), None
    except ValidationError as e:
        errors = e.errors(include_input=False, include_url=False)
        return None, JSONResponse({"detail": _error_list([{**x, "loc": ("body", *x["loc"])} for x in errors]),
                                   "errors": len(errors)}, status_code=422)


def _finite(score: float) -> float | None:
    """A score JSON can carry (a retriever's NaN would make the whole response a 500)."""
    score = float(score)
    return score if math.isfinite(score) else None


# ---------------------------------------------------------------- serving


def read_token(token_file: Path | None = None) -> Optional[str]:
    """The bearer token: the first line of `token_file`, else $RAGTEAM_RETRIEVER_TOKEN, else None. A file that is
    missing or empty is an error naming it (a typo must not leave the service open)."""
    if token_file is not None:
        try:
            lines = Path(token_file).read_text().strip().splitlines()
        except OSError as e:
            raise ValueError(f"--token-file {token_file}: cannot read it ({e.strerror or e})") from None
        token = lines[0].strip() if lines else ""
        if len(token) < 16:
            raise ValueError(f"--token-file {token_file}: the token must be at least 16 characters on its first "
                             f"line (has {len(token)}); e.g. `python -c 'import secrets; "
                             f"print(secrets.token_urlsafe(32))' > {token_file}`")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token and len(token) < 16:
        raise ValueError(f"${TOKEN_ENV} must be at least 16 characters (has {len(token)})")
    return token or None


def exposure_for(host: str, token: Optional[str], allowed_hosts: list[str] | tuple[str, ...] = (),
                 docs: bool = False) -> Exposure:
    """What binding to `host` requires. Loopback: Host must be a loopback name (or one of `allowed_hosts`), a token
    is optional (`serve` warns when there is none, since any local user can query). Any other address: a token (else ValueError, and the service does not start) and a
    Host check, against `allowed_hosts` or, when none are given, the bound address and this machine's names."""
    if is_loopback(host):  # Host still checked: a page on another site resolving to 127.0.0.1 (DNS rebinding)
        return Exposure(token=token, allowed_hosts=tuple(allowed_hosts) or LOOPBACK_NAMES, docs=docs)
    if token is None:
        raise ValueError(f"--host {host} is not a loopback address: the service would be open to the network. "
                         f"Give it a bearer token (--token-file FILE or ${TOKEN_ENV}, at least 16 characters) and "
                         f"the same token to its clients, or bind 127.0.0.1")
    if not allowed_hosts:
        import socket

        names = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1"}
        if host not in ("0.0.0.0", "::"):
            names.add(host)
        allowed_hosts = sorted(n for n in names if n)
    return Exposure(token=token, allowed_hosts=tuple(allowed_hosts), docs=docs)


def _uvicorn_config(app: FastAPI, host: str, port: int, limits: ServiceLimits, log_level: str):
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    per_client: dict[str, int] = {}   # open connections per client address, for this server

    class StallGuardedH11(H11Protocol):
        """uvicorn's h11 protocol with a deadline for each request's headers: after connecting, and again after each
        reply, a client has `header_timeout_s` to send a whole request head or the connection is closed (uvicorn's
        keep-alive timer stops at the first byte, so a head sent a byte at a time would otherwise hold the slot for
        ever). One address holds at most `max_connections_per_client` connections; more are closed at once, so no
        one client can take every slot. Bodies fall under the `_Guard` middleware's deadline."""

        def connection_made(self, transport):
            super().connection_made(transport)
            peer = (transport.get_extra_info("peername") or ("?",))[0]
            self._peer = str(peer)
            per_client[self._peer] = per_client.get(self._peer, 0) + 1
            self._timer = None
            if per_client[self._peer] > limits.max_connections_per_client:
                transport.close()
                return
            self._arm()

        def _arm(self):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self.loop.call_later(limits.header_timeout_s, self._close_if_stalled, self.cycle)

        def _close_if_stalled(self, cycle_then):
            # no request head has come in since the deadline was set (the cycle is the one it was then), and none
            # is being answered: a stalled head
            if self.cycle is cycle_then and (cycle_then is None or cycle_then.response_complete) \
                    and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            if self._timer is not None:
                self._timer.cancel()
            n = per_client.get(self._peer, 1) - 1
            if n > 0:
                per_client[self._peer] = n
            else:
                per_client.pop(self._peer, None)
            super().connection_lost(exc)

    return uvicorn.Config(app, host=host, port=port, access_log=False, log_level=log_level, http=StallGuardedH11,
                          limit_concurrency=limits.max_connections, timeout_keep_alive=5,
                          h11_max_incomplete_event_size=64 * 1024)


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0,
                    limits: ServiceLimits = ServiceLimits()):
    """Run `app` with uvicorn in a background thread (port 0: a free one); yields the base URL, stops on exit.

    For tests, benchmarks and workflows that want the HTTP path without a second process.
    """
    import threading
    import time

    import uvicorn

    server = uvicorn.Server(_uvicorn_config(app, host, port, limits, "warning"))
    thread = threading.Thread(target=server.run, name="retrieval-service", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"retrieval service did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()
    try:
        yield f"http://{host}:{bound[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=timeout)


def serve(retriever: Retriever, *, host: str = "127.0.0.1", port: int = 8000,
          limits: ServiceLimits = ServiceLimits(), name: str = "", exposure: Exposure | None = None) -> None:
    """Run the service in this process until interrupted. `exposure` defaults to what `host` requires
    (`exposure_for`: beyond loopback, a token from $RAGTEAM_RETRIEVER_TOKEN or ValueError)."""
    import sys

    import uvicorn

    exposure = exposure or exposure_for(host, read_token())
    if not is_loopback(host) and exposure.token is None:
        raise ValueError(f"--host {host} is not a loopback address and the service has no token")
    if exposure.token is None:
        log.warning("the retrieval service on %s has no token: any local process can query it", host)
    if "torch" in sys.modules:  # a dense retriever is loaded
        import torch

        if not torch.cuda.is_available():
            # Leave a core to the event loop: with every core in torch's OpenMP pool, HTTP handling and the
            # encoder spin against each other (2.4x less throughput measured with 50 clients on 2 cores).
            torch.set_num_threads(max(1, (os.cpu_count() or 2) - 1))

    uvicorn.Server(_uvicorn_config(create_app(retriever, limits, name=name, exposure=exposure), host, port, limits,
                                   "info")).run()
