"""Raw S3 requests signed with AWS Signature Version 4, standard library only: for what pyarrow's S3
filesystem cannot send (conditional writes, ``If-None-Match``/``If-Match``), against the tests' S3
server. One request per call, over a new HTTP connection; the answer is returned, never raised."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
from dataclasses import dataclass
from urllib.parse import quote, urlparse


@dataclass(frozen=True)
class S3Response:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def etag(self) -> str | None:
        return self.headers.get("etag")


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def signed_request(
    endpoint: str,
    access_key: str,
    secret_key: str,
    region: str,
    method: str,
    bucket: str,
    key: str = "",
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> S3Response:
    """``method`` on ``/bucket/key`` (path style) of ``endpoint`` (``http://host:port``), signed for
    ``access_key``; of ``headers``, the ``x-amz-*`` ones are signed (SigV4 requires it), the others
    are sent unsigned, as S3 allows."""
    url = urlparse(endpoint)
    host = url.netloc
    path = quote(f"/{bucket}/{key}" if key else f"/{bucket}", safe="/-_.~")
    now = dt.datetime.now(dt.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(body).hexdigest()
    extra = {k: v for k, v in (headers or {}).items() if not k.lower().startswith("x-amz-")}
    signed = {k.lower(): v for k, v in (headers or {}).items() if k.lower().startswith("x-amz-")}
    signed.update({"host": host, "x-amz-content-sha256": payload_hash, "x-amz-date": amz_date})
    names = ";".join(sorted(signed))
    canonical = "\n".join(
        [method, path, "", *(f"{k}:{signed[k]}" for k in sorted(signed)), "", names, payload_hash]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key_ = _hmac(_hmac(_hmac(_hmac(("AWS4" + secret_key).encode(), day), region), "s3"), "aws4_request")
    signature = hmac.new(key_, to_sign.encode(), hashlib.sha256).hexdigest()
    send = {
        **signed,
        "Authorization": f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={names}, Signature={signature}",
        "Content-Length": str(len(body)),
        **extra,
    }
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=send)
        resp = conn.getresponse()
        return S3Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()
