#!/usr/bin/env python3
"""An object store that checks every request's signature with the REFERENCE signers, for the
signing tests: AWS Signature V4 with botocore (`S3SigV4Auth` for service s3, `SigV4Auth` for any
other service) and OSS V4 with alibabacloud-oss-v2's `SignerV4`. bearerd's own signer is never
consulted, so a request that passes here is one the SDKs' signers agree with.

    python3 signing_origin.py [--aws-region us-east-1] [--oss-region cn-hangzhou]

Prints `READY <port> <adminport>` and exits when stdin closes, like the other fixtures.

The signed port (<port>) answers like the real services (status codes and XML error shapes of S3
and OSS, the `x-oss-ec` field of OSS, `Date` in the origin's own clock):
  - `Authorization: AWS4-HMAC-SHA256 …`: SigV4. The signed headers are those the request names in
    SignedHeaders (every `x-amz-*` field present must be among them); `X-Amz-Date` within 15 minutes
    of the origin's clock; the key known, not expired, its session token sent and signed;
    `X-Amz-Content-SHA256` (S3) either `UNSIGNED-PAYLOAD` or the body's SHA-256.
    Errors: 403 SignatureDoesNotMatch (with StringToSign and CanonicalRequest as S3 sends them),
    403 InvalidAccessKeyId, 400 ExpiredToken, 400 InvalidToken, 403 RequestTimeTooSkewed (with
    RequestTime, ServerTime, MaxAllowedSkewMilliseconds), 400 XAmzContentSHA256Mismatch,
    403 AccessDenied (unsigned x-amz-* fields, no Authorization), 400 AuthorizationHeaderMalformed
    (wrong region or date in the credential scope), 411 MissingContentLength (chunked upload).
  - `Authorization: OSS4-HMAC-SHA256 …`: OSS V4. `x-oss-date` within 15 minutes; the key known,
    not expired (403 SecurityTokenExpired, EC 0002-00000007), its `x-oss-security-token`;
    `x-oss-content-sha256` must be UNSIGNED-PAYLOAD (OSS accepts nothing else: 400 InvalidArgument,
    EC 0002-00000214); skew is 403 RequestTimeTooSkewed (EC 0002-00000504) with ServerTime.
    Path-style (`/BUCKET/KEY`) unless the admin sets `oss_vhost_bucket` (then the origin is that
    bucket's virtual host and the path is the key).
  A HEAD answer carries no body (OSS keeps its `x-oss-ec` field), as the services do.
  Objects: PUT stores the body under its decoded name (`s3:/bucket/key`, `oss:/bucket/key`),
  GET/HEAD serve it, DELETE removes it. Bodies above 1 MiB are kept as length and SHA-256 only
  (a GET of one answers 409 OracleBodyNotKept).

The admin port (<adminport>; never reachable by signed traffic) holds the test's controls, all JSON:
  POST /__admin/keys {id, secret, token?, expires_at?}   a known key (expires_at: epoch seconds)
  POST /__admin/revoke {id} | {vendor}                   forget keys: InvalidAccessKeyId from now on
  POST /__admin/expire {id} | {vendor}                   expire keys now: ExpiredToken / SecurityTokenExpired
  POST /__admin/wrong_secret {id} | {vendor}             verify those keys (and, for a vendor, its later
                                                         keys) with a wrong secret: SignatureDoesNotMatch
  POST /__admin/clock {offset_seconds}                   the origin's clock = real time + offset
  POST /__admin/config {aws_region?, oss_region?, oss_vhost_bucket?}
  POST /__admin/vendor {name, shape: container|aliyun, lifetime_seconds, delay_ms?}
  GET  /__vend/NAME                                      mints new keys known to the origin and answers
                                                         them as container-credentials JSON (shape
                                                         container) or seed 004's JSON (shape aliyun),
                                                         expiring lifetime_seconds later (origin clock)
  GET  /__admin/stats                                    outcomes, attempts per path, vending calls,
                                                         objects (length, sha256), last requests
  POST /__admin/reset_stats
"""
import argparse
import datetime
import hashlib
import hmac
import http.server
import json
import secrets
import string
import sys
import threading
import time
import uuid
from urllib.parse import quote, unquote_to_bytes

from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from alibabacloud_oss_v2.signer.v4 import SignerV4
from alibabacloud_oss_v2.types import Credentials as OSSCredentials
from alibabacloud_oss_v2.types import HttpRequest as OSSHttpRequest
from alibabacloud_oss_v2.types import SigningContext as OSSSigningContext

KEEP_BODY_LIMIT = 1024 * 1024
MAX_SKEW_SECONDS = 15 * 60
READ_CHUNK = 1024 * 1024
UNSIGNED = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def xml_escape(s):
    return (str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


def iso_z(epoch, millis=False):
    t = datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (".000Z" if millis else "Z")


def parse_amz_date(value):
    """`20260101T120000Z` → epoch seconds, or None."""
    try:
        t = datetime.datetime.strptime(value, "%Y%m%dT%H%M%SZ")
    except (TypeError, ValueError):
        return None
    return t.replace(tzinfo=datetime.timezone.utc).timestamp()


def random_text(n, alphabet):
    return "".join(secrets.choice(alphabet) for _ in range(n))


class Key:
    def __init__(self, key_id, secret, token=None, expires_at=None, vendor=None, wrong_secret=False):
        self.id = key_id
        self.secret = secret
        self.token = token
        self.expires_at = expires_at
        self.vendor = vendor
        self.wrong_secret = wrong_secret


class Vendor:
    def __init__(self, name, shape, lifetime, delay_ms):
        self.name = name
        self.shape = shape
        self.lifetime = lifetime
        self.delay_ms = delay_ms
        self.calls = 0
        self.minted = 0
        self.wrong_secret = False


class StoredObject:
    def __init__(self, length, sha256, md5, body):
        self.length = length
        self.sha256 = sha256
        self.md5 = md5
        self.body = body


class Oracle:
    """All state, guarded by `lock`: keys, vendors, objects, clock offset and the counters."""

    def __init__(self, aws_region, oss_region):
        self.lock = threading.Lock()
        self.keys = {}
        self.revoked = set()
        self.vendors = {}
        self.objects = {}
        self.offset = 0.0
        self.aws_region = aws_region
        self.oss_region = oss_region
        self.oss_vhost_bucket = None
        self.reset_stats()

    def reset_stats(self):
        self.outcomes = {}
        self.attempts = {}
        self.requests = []

    def now(self):
        return time.time() + self.offset

    def record(self, entry):
        with self.lock:
            outcome = entry["outcome"]
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            per = self.attempts.setdefault(entry["path"], {})
            per[outcome] = per.get(outcome, 0) + 1
            self.requests.append(entry)
            del self.requests[:-500]

    def keys_matching(self, body):
        """Ids named by an admin body: {id} or {vendor}."""
        if "id" in body:
            return [body["id"]]
        return [k.id for k in self.keys.values() if k.vendor == body.get("vendor")]

    def mint(self, vendor):
        """New keys for `vendor`, registered here; the vending JSON for them."""
        with self.lock:
            vendor.calls += 1
            vendor.minted += 1
            n = vendor.minted
            expires = int(self.now() + vendor.lifetime)
            if vendor.shape == "aliyun":
                key_id = f"STS.{vendor.name}{n}" + random_text(12, string.ascii_letters + string.digits)
            else:
                key_id = "ASIA" + random_text(16, string.ascii_uppercase + string.digits)
            secret = random_text(40, string.ascii_letters + string.digits + "+/")
            token = random_text(300, string.ascii_letters + string.digits + "+/") + "=="
            self.keys[key_id] = Key(key_id, secret, token, expires, vendor.name, vendor.wrong_secret)
        if vendor.shape == "aliyun":
            return {"accessKeyId": key_id, "accessKeySecret": secret, "securityToken": token,
                    "expiration": iso_z(expires)}
        return {"AccessKeyId": key_id, "SecretAccessKey": secret, "Token": token,
                "Expiration": iso_z(expires), "RoleArn": f"arn:aws:iam::123456789012:role/{vendor.name}"}

    def stats(self):
        with self.lock:
            return {
                "outcomes": dict(self.outcomes),
                "attempts": {p: dict(v) for p, v in self.attempts.items()},
                "vend_calls": {n: v.calls for n, v in self.vendors.items()},
                "keys": len(self.keys),
                "revoked": len(self.revoked),
                "objects": {n: {"length": o.length, "sha256": o.sha256, "kept": o.body is not None}
                            for n, o in self.objects.items()},
                "requests": list(self.requests[-200:]),
                "clock_offset": self.offset,
            }


class Refusal(Exception):
    """An error answer: status, code and the extra elements of the error document."""

    def __init__(self, status, code, message, extra=(), ec=None):
        super().__init__(code)
        self.status = status
        self.code = code
        self.message = message
        self.extra = list(extra)
        self.ec = ec


def split_target(raw):
    """The request target (as the latin-1 str http.server gives) → (path bytes, query bytes)."""
    b = raw.encode("latin-1")
    path, _, query = b.partition(b"?")
    return path, query


def query_pairs(query):
    """Decoded (key, value, had '=') triples, in the order sent."""
    out = []
    for part in query.split(b"&"):
        if not part:
            continue
        k, eq, v = part.partition(b"=")
        out.append((unquote_to_bytes(k), unquote_to_bytes(v), bool(eq)))
    return out


def rfc3986(b):
    return quote(b, safe="-_.~")


class SignedHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "SigningOracle/1"
    oracle = None  # set on the class by main()

    def log_message(self, fmt, *args):  # quiet: stderr is kept for failures only
        pass

    def date_time_string(self, timestamp=None):
        return super().date_time_string(self.oracle.now() if timestamp is None else timestamp)

    # --- the body ---------------------------------------------------------------------------

    def read_body(self):
        """Reads the whole body: (length, sha256 hex, md5 hex, bytes or None above 1 MiB)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raise Refusal(411, "MissingContentLength", "You must provide the Content-Length HTTP header.")
        length = int(self.headers.get("Content-Length") or 0)
        sha, md5 = hashlib.sha256(), hashlib.md5()
        kept = bytearray() if length <= KEEP_BODY_LIMIT else None
        left = length
        while left > 0:
            chunk = self.rfile.read(min(READ_CHUNK, left))
            if not chunk:
                raise ConnectionError("body cut short")
            left -= len(chunk)
            sha.update(chunk)
            md5.update(chunk)
            if kept is not None:
                kept += chunk
        return length, sha.hexdigest(), md5.hexdigest(), (bytes(kept) if kept is not None else None)

    # --- answers ----------------------------------------------------------------------------

    def answer(self, status, headers=(), body=b""):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if status != 204:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def refuse(self, scheme, r):
        rid = uuid.uuid4().hex[:16].upper()
        host = xml_escape(self.headers.get("Host") or "")
        parts = [f"<Code>{r.code}</Code>", f"<Message>{xml_escape(r.message)}</Message>"]
        parts += [f"<{n}>{xml_escape(v)}</{n}>" for n, v in r.extra]
        headers = [("Content-Type", "application/xml")]
        if scheme == "oss":
            parts += [f"<RequestId>{rid}</RequestId>", f"<HostId>{host}</HostId>"]
            if r.ec:
                parts += [f"<EC>{r.ec}</EC>", f"<RecommendDoc>https://api.aliyun.com/troubleshoot?q={r.ec}</RecommendDoc>"]
                headers.append(("x-oss-ec", r.ec))
            headers += [("x-oss-request-id", rid), ("Server", "AliyunOSS")]
        else:
            parts += [f"<RequestId>{rid}</RequestId>", "<HostId>oracle</HostId>"]
            headers.append(("x-amz-request-id", rid))
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Error>' + "".join(parts) + "</Error>").encode()
        if r.status == 411:
            self.close_connection = True
            headers.append(("Connection", "close"))
        self.answer(r.status, headers, body)

    # --- verbs ------------------------------------------------------------------------------

    def do_GET(self):
        self.handle_signed()

    do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

    def handle_signed(self):
        o = self.oracle
        raw_path, raw_query = split_target(self.path)
        entry = {"method": self.command, "path": self.path, "scheme": None, "key_id": None,
                 "outcome": "OK", "status": 200, "date": None, "content_sha256": None}
        auth = self.headers.get("Authorization") or ""
        scheme = "oss" if auth.startswith("OSS4-HMAC-SHA256") else "aws"
        entry["scheme"] = scheme
        try:
            length, sha, md5, body = self.read_body()
            entry["body_length"] = length
            entry["query"] = [[k.decode("utf-8", "replace"), v.decode("utf-8", "replace")] for k, v, _ in query_pairs(raw_query)]
            if not auth:
                raise Refusal(403, "AccessDenied", "Anonymous access is forbidden for this operation")
            if scheme == "oss":
                name = self.verify_oss(auth, raw_path, raw_query, entry)
            elif auth.startswith("AWS4-HMAC-SHA256"):
                name = self.verify_sigv4(auth, raw_path, raw_query, sha, body, entry)
            else:
                raise Refusal(400, "InvalidArgument", "Unsupported Authorization Type")
            entry["object"] = name
            status, headers, reply = self.operate(scheme, name, length, sha, md5, body)
        except Refusal as r:
            entry["outcome"], entry["status"] = r.code, r.status
            o.record(entry)
            self.refuse(scheme, r)
            return
        except (ConnectionError, ValueError) as e:
            entry["outcome"], entry["status"] = f"broken:{type(e).__name__}", 400
            o.record(entry)
            self.close_connection = True
            return
        # Recorded before the answer leaves, so a client that has its answer finds it in the stats.
        entry["status"] = status
        o.record(entry)
        self.answer(status, headers, reply)

    def operate(self, scheme, name, length, sha, md5, body):
        """Carries out an authenticated request: (status, headers, body to send)."""
        o = self.oracle
        rid = uuid.uuid4().hex[:16].upper()
        ids = [("x-oss-request-id" if scheme == "oss" else "x-amz-request-id", rid)]
        if self.command == "PUT":
            with o.lock:
                o.objects[name] = StoredObject(length, sha, md5, body)
            return 200, ids + [("ETag", f'"{md5}"')], b""
        if self.command in ("GET", "HEAD"):
            with o.lock:
                obj = o.objects.get(name)
            if obj is None:
                raise Refusal(404, "NoSuchKey", "The specified key does not exist.", [("Key", name.split("/", 2)[-1])],
                              ec="0026-00000001" if scheme == "oss" else None)
            if obj.body is None:
                raise Refusal(409, "OracleBodyNotKept", f"the origin kept only the length ({obj.length}) and SHA-256 of this body")
            return 200, ids + [("ETag", f'"{obj.md5}"'), ("Content-Type", "application/octet-stream"),
                               ("x-oracle-sha256", obj.sha256)], obj.body
        if self.command == "POST":
            reply = json.dumps({"object": name, "length": length, "sha256": sha}).encode()
            return 200, ids + [("Content-Type", "application/json")], reply
        if self.command == "DELETE":
            with o.lock:
                o.objects.pop(name, None)
            return 204, ids, b""
        raise Refusal(405, "MethodNotAllowed", "The specified method is not allowed against this resource.")

    # --- credentials common to both schemes --------------------------------------------------

    def check_key(self, scheme, key_id, token_sent, request_time):
        """The key's secret, or a refusal: skew, unknown key, expired, wrong or missing token."""
        o = self.oracle
        now = o.now()
        if abs(request_time - now) > MAX_SKEW_SECONDS:
            raw = self.headers.get("x-oss-date" if scheme == "oss" else "X-Amz-Date") or ""
            if scheme == "oss":
                raise Refusal(403, "RequestTimeTooSkewed", "The difference between the request time and the current time is too large.",
                              [("MaxAllowedSkewMilliseconds", "900000"), ("RequestTime", iso_z(request_time, True)),
                               ("ServerTime", iso_z(now, True))], ec="0002-00000504")
            raise Refusal(403, "RequestTimeTooSkewed", "The difference between the request time and the current time is too large.",
                          [("RequestTime", raw), ("ServerTime", iso_z(now)), ("MaxAllowedSkewMilliseconds", "900000")])
        with o.lock:
            key = o.keys.get(key_id)
        if key is None:
            if scheme == "oss":
                raise Refusal(403, "InvalidAccessKeyId", "The OSS Access Key Id you provided does not exist in our records.",
                              [("OSSAccessKeyId", key_id)], ec="0002-00000002")
            raise Refusal(403, "InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.",
                          [("AWSAccessKeyId", key_id)])
        if key.token is not None:
            if token_sent is None or not hmac.compare_digest(token_sent.encode(), key.token.encode()):
                if scheme == "oss":
                    raise Refusal(403, "InvalidSecurityToken", "The security token you provided is invalid.", ec="0002-00000006")
                raise Refusal(400, "InvalidToken", "The provided token is malformed or otherwise invalid.",
                              [("Token-0", token_sent or "")])
        elif token_sent is not None:
            raise Refusal(400, "InvalidToken", "The provided token is malformed or otherwise invalid.")
        if key.expires_at is not None and now >= key.expires_at:
            if scheme == "oss":
                raise Refusal(403, "SecurityTokenExpired", "The security token you provided has expired.", ec="0002-00000007")
            raise Refusal(400, "ExpiredToken", "The provided token has expired.", [("Token-0", token_sent or "")])
        return key.secret + ("-not-the-secret" if key.wrong_secret else "")

    # --- SigV4 ------------------------------------------------------------------------------

    def verify_sigv4(self, auth, raw_path, raw_query, body_sha, body, entry):
        o = self.oracle
        fields = {}
        for part in auth[len("AWS4-HMAC-SHA256"):].split(","):
            k, _, v = part.strip().partition("=")
            fields[k] = v
        try:
            key_id, date, region, service, terminal = fields["Credential"].split("/")
            signed = fields["SignedHeaders"].split(";")
            provided = fields["Signature"]
        except (KeyError, ValueError):
            raise Refusal(400, "AuthorizationHeaderMalformed", "The authorization header is malformed.")
        entry["key_id"] = key_id
        amz_date = self.headers.get("X-Amz-Date")
        entry["date"] = amz_date
        request_time = parse_amz_date(amz_date)
        if request_time is None:
            raise Refusal(403, "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header")
        if terminal != "aws4_request" or date != amz_date[:8]:
            raise Refusal(400, "AuthorizationHeaderMalformed", "The authorization header is malformed; the credential scope's date or terminator is wrong.")
        if region != o.aws_region:
            raise Refusal(400, "AuthorizationHeaderMalformed",
                          f"The authorization header is malformed; the region '{region}' is wrong; expecting '{o.aws_region}'",
                          [("Region", o.aws_region)])
        present = {k.lower() for k in self.headers.keys()}
        unsigned = sorted(h for h in present if h.startswith("x-amz-") and h not in signed)
        if "host" not in signed or unsigned:
            raise Refusal(403, "AccessDenied", "There were headers present in the request which were not signed",
                          [("HeadersNotSigned", ", ".join(unsigned or ["host"]))])
        content_sha = self.headers.get("X-Amz-Content-SHA256")
        entry["content_sha256"] = content_sha
        if service == "s3":
            if content_sha is None:
                raise Refusal(400, "InvalidRequest", "Missing required header for this request: x-amz-content-sha256")
            if content_sha != UNSIGNED and (len(content_sha) != 64 or any(c not in "0123456789abcdef" for c in content_sha)):
                raise Refusal(400, "InvalidArgument", "x-amz-content-sha256 must be UNSIGNED-PAYLOAD or a SHA-256 value",
                              [("ArgumentName", "x-amz-content-sha256"), ("ArgumentValue", content_sha)])
        secret = self.check_key("aws", key_id, self.headers.get("X-Amz-Security-Token"), request_time)

        # The request as the server decoded it, re-encoded by the one SigV4 rule: S3 names an object
        # by its whole decoded key (an encoded `/` is a `/`); every other service gets its path
        # segment by segment and botocore encodes it once more (its own rule for them).
        decoded_path = unquote_to_bytes(raw_path)
        if service == "s3":
            canonical_path = quote(decoded_path, safe="/~")
        else:
            canonical_path = "/".join(quote(unquote_to_bytes(seg), safe="~") for seg in raw_path.split(b"/"))
        pairs = [f"{rfc3986(k)}={rfc3986(v)}" for k, v, _ in query_pairs(raw_query)]
        host = self.headers.get("Host") or ""
        url = f"http://{host}{canonical_path}" + ("?" + "&".join(pairs) if pairs else "")
        req = AWSRequest(method=self.command, url=url, data=body if body is not None else b"")
        for name in signed:
            for value in self.headers.get_all(name) or []:
                req.headers[name] = value
        req.context["timestamp"] = amz_date
        signer_class = S3SigV4Auth if service == "s3" else SigV4Auth
        signer = signer_class(Credentials(key_id, secret, None), service, region)
        if service != "s3" and content_sha is None and body is None:
            raise Refusal(413, "EntityTooLarge", "the origin hashes non-S3 bodies only up to 1 MiB")
        canonical = signer.canonical_request(req)
        string_to_sign = signer.string_to_sign(req, canonical)
        expected = signer.signature(string_to_sign, req)
        if not hmac.compare_digest(expected.encode(), provided.encode()):
            raise Refusal(403, "SignatureDoesNotMatch",
                          "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
                          [("AWSAccessKeyId", key_id), ("StringToSign", string_to_sign), ("SignatureProvided", provided),
                           ("StringToSignBytes", " ".join(f"{b:02x}" for b in string_to_sign.encode())),
                           ("CanonicalRequest", canonical),
                           ("CanonicalRequestBytes", " ".join(f"{b:02x}" for b in canonical.encode()))])
        if content_sha is not None and content_sha != UNSIGNED and content_sha != body_sha:
            raise Refusal(400, "XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was computed.",
                          [("ClientComputedContentSHA256", content_sha), ("S3ComputedContentSHA256", body_sha)])
        if service != "s3":
            return f"{service}:" + decoded_path.decode("utf-8", "replace")
        try:
            return "s3:" + decoded_path.decode("utf-8")
        except UnicodeDecodeError:
            raise Refusal(400, "InvalidURI", "Couldn't parse the specified URI.")

    # --- OSS V4 -----------------------------------------------------------------------------

    def verify_oss(self, auth, raw_path, raw_query, entry):
        o = self.oracle
        fields = {}
        for part in auth[len("OSS4-HMAC-SHA256"):].split(","):
            k, _, v = part.strip().partition("=")
            fields[k] = v
        try:
            key_id, date, region, product, terminal = fields["Credential"].split("/")
            provided = fields["Signature"]
        except (KeyError, ValueError):
            raise Refusal(400, "InvalidArgument", "Authorization header is invalid.", ec="0002-00000201")
        additional = [h for h in fields.get("AdditionalHeaders", "").split(";") if h]
        entry["key_id"] = key_id
        oss_date = self.headers.get("x-oss-date")
        entry["date"] = oss_date
        request_time = parse_amz_date(oss_date)
        if request_time is None:
            raise Refusal(403, "AccessDenied", "x-oss-date is missing or invalid.", ec="0002-00000505")
        if terminal != "aliyun_v4_request" or product != "oss" or date != oss_date[:8] or region != o.oss_region:
            raise Refusal(400, "InvalidArgument", f"Invalid signing scope {date}/{region}/{product}/{terminal}; expecting region {o.oss_region}.",
                          ec="0002-00000227")
        content_sha = self.headers.get("x-oss-content-sha256")
        entry["content_sha256"] = content_sha
        if content_sha != UNSIGNED:
            raise Refusal(400, "InvalidArgument", "x-oss-content-sha256 must be UNSIGNED-PAYLOAD.", ec="0002-00000214")
        token_sent = self.headers.get("x-oss-security-token")
        secret = self.check_key("oss", key_id, token_sent, request_time)

        decoded_path = unquote_to_bytes(raw_path)
        try:
            path_text = decoded_path.decode("utf-8")
        except UnicodeDecodeError:
            raise Refusal(400, "InvalidURI", "Couldn't parse the specified URI.")
        if o.oss_vhost_bucket:
            bucket, key = o.oss_vhost_bucket, path_text[1:]
        else:
            bucket, _, key = path_text[1:].partition("/")
        pairs = [f"{rfc3986(k)}={rfc3986(v)}" if v else rfc3986(k) for k, v, _ in query_pairs(raw_query)]
        host = self.headers.get("Host") or ""
        url = f"http://{host}{quote(decoded_path, safe='/~')}" + ("?" + "&".join(pairs) if pairs else "")
        headers = {}
        for name in self.headers.keys():
            values = self.headers.get_all(name) or []
            headers[name.lower()] = ",".join(values)
        headers.pop("authorization", None)
        req = OSSHttpRequest(self.command, url, headers=headers)
        ctx = OSSSigningContext(product="oss", region=region, bucket=bucket or None, key=key or None, request=req,
                                credentials=OSSCredentials(key_id, secret, token_sent),
                                signing_time=datetime.datetime.fromtimestamp(request_time, datetime.timezone.utc),
                                additional_headers=set(additional) if additional else None)
        signer = SignerV4()
        signer.sign(ctx)
        computed = req.headers["Authorization"].rsplit("Signature=", 1)[-1]
        if not hmac.compare_digest(computed.encode(), provided.encode()):
            canonical = signer._calc_canonical_request(ctx, signer._common_additional_headers(req, ctx.additional_headers))
            raise Refusal(403, "SignatureDoesNotMatch",
                          "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
                          [("OSSAccessKeyId", key_id), ("SignatureProvided", provided), ("StringToSign", ctx.string_to_sign),
                           ("StringToSignBytes", " ".join(f"{b:02x}" for b in ctx.string_to_sign.encode())),
                           ("CanonicalRequest", canonical)], ec="0002-00000040")
        return f"oss:/{bucket}/{key}"


class AdminHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    oracle = None

    def log_message(self, fmt, *args):
        pass

    def reply(self, status, obj):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        o = self.oracle
        if self.path == "/__admin/stats":
            return self.reply(200, o.stats())
        if self.path.startswith("/__vend/"):
            name = self.path[len("/__vend/"):]
            with o.lock:
                vendor = o.vendors.get(name)
            if vendor is None:
                return self.reply(404, {"error": "no such vendor"})
            if vendor.delay_ms:
                time.sleep(vendor.delay_ms / 1000)
            return self.reply(200, o.mint(vendor))
        self.reply(404, {"error": "not found"})

    def do_POST(self):
        o = self.oracle
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self.reply(400, {"error": "bad json"})
        with o.lock:
            if self.path == "/__admin/keys":
                o.keys[body["id"]] = Key(body["id"], body["secret"], body.get("token"), body.get("expires_at"))
                o.revoked.discard(body["id"])
                return self.reply(200, {"ok": True})
            if self.path == "/__admin/revoke":
                ids = o.keys_matching(body)
                for i in ids:
                    o.keys.pop(i, None)
                    o.revoked.add(i)
                return self.reply(200, {"revoked": ids})
            if self.path == "/__admin/expire":
                ids = o.keys_matching(body)
                for i in ids:
                    if i in o.keys:
                        o.keys[i].expires_at = o.now() - 1
                return self.reply(200, {"expired": ids})
            if self.path == "/__admin/wrong_secret":
                ids = o.keys_matching(body)
                for i in ids:
                    if i in o.keys:
                        o.keys[i].wrong_secret = True
                if "vendor" in body and body["vendor"] in o.vendors:
                    o.vendors[body["vendor"]].wrong_secret = True
                return self.reply(200, {"wrong_secret": ids})
            if self.path == "/__admin/clock":
                o.offset = float(body["offset_seconds"])
                return self.reply(200, {"now": o.now()})
            if self.path == "/__admin/config":
                o.aws_region = body.get("aws_region", o.aws_region)
                o.oss_region = body.get("oss_region", o.oss_region)
                if "oss_vhost_bucket" in body:
                    o.oss_vhost_bucket = body["oss_vhost_bucket"]
                return self.reply(200, {"ok": True})
            if self.path == "/__admin/vendor":
                shape = body.get("shape", "container")
                if shape not in ("container", "aliyun"):
                    return self.reply(400, {"error": "shape: container or aliyun"})
                o.vendors[body["name"]] = Vendor(body["name"], shape, float(body.get("lifetime_seconds", 3600)),
                                                 int(body.get("delay_ms", 0)))
                return self.reply(200, {"ok": True})
            if self.path == "/__admin/reset_stats":
                o.reset_stats()
                for v in o.vendors.values():
                    v.calls = 0
                return self.reply(200, {"ok": True})
        self.reply(404, {"error": "not found"})


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--aws-region", default="us-east-1")
    p.add_argument("--oss-region", default="cn-hangzhou")
    args = p.parse_args()
    oracle = Oracle(args.aws_region, args.oss_region)
    SignedHandler.oracle = oracle
    AdminHandler.oracle = oracle
    signed = Server(("127.0.0.1", 0), SignedHandler)
    admin = Server(("127.0.0.1", 0), AdminHandler)
    for s in (signed, admin):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print(f"READY {signed.server_address[1]} {admin.server_address[1]}", flush=True)
    sys.stdin.read()
    signed.shutdown()
    admin.shutdown()


if __name__ == "__main__":
    main()
