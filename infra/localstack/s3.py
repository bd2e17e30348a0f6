"""A minimal S3 client (stdlib only) for readiness probes and bucket creation.

The supervisor needs exactly ListBuckets, HeadBucket and CreateBucket; signing
them with AWS Signature V4 here keeps boto3 out of the dependencies and makes
the probe exercise the same authentication path real clients use.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import http.client
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def sigv4_headers(
    *,
    method: str,
    host: str,
    path: str,
    query: Mapping[str, str],
    access_key: str,
    secret_key: str,
    region: str,
    now: dt.datetime,
    payload_sha256: str = EMPTY_SHA256,
    service: str = "s3",
) -> dict[str, str]:
    """Headers (incl. Authorization) that sign a request with AWS Signature V4."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    headers = {"host": host, "x-amz-content-sha256": payload_sha256, "x-amz-date": amz_date}
    canonical_query = "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(query.items())
    )
    signed = ";".join(sorted(headers))
    canonical_headers = "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers))
    canonical_request = "\n".join(
        [
            method,
            urllib.parse.quote(path, safe="/-_.~"),
            canonical_query,
            canonical_headers,
            signed,
            payload_sha256,
        ]
    )
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            amz_date,
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = _hmac(("AWS4" + secret_key).encode(), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return headers


@dataclass(frozen=True)
class S3Response:
    status: int
    body: bytes


@dataclass(frozen=True)
class MiniS3:
    """Path-style S3 calls against one endpoint (``http://host:port``)."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str
    timeout_s: float = 5.0

    def request(self, method: str, path: str, query: Mapping[str, str] | None = None) -> S3Response:
        url = urllib.parse.urlsplit(self.endpoint)
        host = url.netloc
        query = dict(query or {})
        headers = sigv4_headers(
            method=method,
            host=host,
            path=path,
            query=query,
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=self.region,
            now=dt.datetime.now(dt.UTC),
        )
        target = path + ("?" + urllib.parse.urlencode(sorted(query.items())) if query else "")
        conn = http.client.HTTPConnection(
            url.hostname or "127.0.0.1", url.port, timeout=self.timeout_s
        )
        try:
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
            return S3Response(resp.status, resp.read())
        finally:
            conn.close()

    def list_buckets(self) -> list[str]:
        """Names of all buckets; raises on any non-200 answer (used as the readiness probe)."""
        resp = self.request("GET", "/")
        if resp.status != 200:
            raise ConnectionError(f"ListBuckets answered HTTP {resp.status}: {resp.body[:200]!r}")
        return [n.decode() for n in re.findall(rb"<Name>([^<]+)</Name>", resp.body)]

    def ensure_bucket(self, bucket: str) -> bool:
        """Create the bucket unless it exists; True if it was created now."""
        if bucket in self.list_buckets():
            return False
        resp = self.request("PUT", f"/{bucket}")
        if resp.status not in (200, 409):
            raise ConnectionError(
                f"CreateBucket {bucket} answered HTTP {resp.status}: {resp.body[:200]!r}"
            )
        return resp.status == 200
