"""`Retriever` over HTTP: talks the Search-R1 `/retrieve` protocol to our service (or to Search-R1's own server)."""
from __future__ import annotations

import ipaddress
import os
import time

import httpx

from ragteam.data.formats import split_contents
from ragteam.retrieval.base import Hit


TOKEN_ENV = "RAGTEAM_RETRIEVER_TOKEN"  # the bearer token, for the server (`serve-retriever`) and this client


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or `localhost`; 0.0.0.0, :: and every other address or name are not."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False



class RetrievalServiceError(RuntimeError):
    """The service rejected a request (4xx, with its message) or stayed unreachable after the retries."""


class HttpRetriever:
    """`search`/`batch_search` against `<url>/retrieve`; long query lists go out in chunks the server accepts."""

    def __init__(self, url: str, *, timeout: float = 60.0, retries: int = 3, max_queries_per_request: int = 256,
                 token: str | None = None):
        """`token`: the service's bearer token (default: $RAGTEAM_RETRIEVER_TOKEN, as `ragteam serve-retriever`
        reads it); it is sent only over https or to a loopback host."""
        from urllib.parse import urlparse

        url = url.rstrip("/")
        self.endpoint = url if url.endswith("/retrieve") else url + "/retrieve"
        self.retries, self.chunk = retries, max_queries_per_request
        token = token if token is not None else (os.environ.get(TOKEN_ENV, "").strip() or None)
        parsed = urlparse(self.endpoint)
        if token and parsed.scheme != "https" and not is_loopback(parsed.hostname or ""):
            raise RetrievalServiceError(f"{self.endpoint}: the bearer token would travel in clear text; use https, "
                                        f"or a loopback address")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)

    def _post(self, body: dict) -> dict:
        for attempt in range(self.retries + 1):
            try:
                resp = self._client.post(self.endpoint, json=body)
            except httpx.TransportError as e:
                err = f"{type(e).__name__}: {e}"
            else:
                if resp.status_code < 400:
                    return resp.json()
                if resp.status_code == 401:
                    raise RetrievalServiceError(f"{self.endpoint} requires a bearer token: set ${TOKEN_ENV} "
                                                f"to the token the service was started with")
                if resp.status_code < 500:  # our request is wrong: retrying cannot help
                    raise RetrievalServiceError(f"{self.endpoint} rejected the request ({resp.status_code}): "
                                                f"{resp.text[:2000]}")
                err = f"HTTP {resp.status_code}: {resp.text[:500]}"
            if attempt < self.retries:
                time.sleep(0.5 * 2 ** attempt)
        raise RetrievalServiceError(f"{self.endpoint} failed after {self.retries + 1} attempts: {err}")

    def batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        out: list[list[Hit]] = []
        for lo in range(0, len(queries), self.chunk):
            # return_scores=true is what every Search-R1 client sends (upstream breaks without it).
            data = self._post({"queries": queries[lo:lo + self.chunk], "topk": k, "return_scores": True})
            for per_query in data["result"]:
                hits = []
                for item in per_query:
                    doc = item["document"]
                    # Search-R1's own BM25 server returns documents without "id": fall back to the title.
                    pid = doc.get("id") or split_contents(doc["contents"])[0]
                    hits.append(Hit(str(pid), doc["contents"], float(item["score"])))
                out.append(hits)
        return out

    def search(self, query: str, k: int) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def close(self) -> None:
        self._client.close()
