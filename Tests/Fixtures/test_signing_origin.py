#!/usr/bin/env python3
"""Self-test of signing_origin.py over real HTTP: requests signed by the reference signers
(botocore's SigV4 signers, alibabacloud-oss-v2's client) pass; every kind of wrong request is
refused with the services' error shapes. So a request that passes through bearerd means its
signature is one the SDKs agree with.

    python3 Tests/Fixtures/test_signing_origin.py      # plain script, exits non-zero on failure
"""
import datetime
import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
import traceback
from urllib.parse import quote

from botocore.auth import S3SigV4Auth, SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

import alibabacloud_oss_v2 as oss

HERE = os.path.dirname(os.path.abspath(__file__))
ORIGIN = os.path.join(HERE, "signing_origin.py")

# Keys named the hard way: every character class the signers treat specially.
HARD_KEYS = [
    "plain.txt",
    "sp ace/and~tilde",
    "plus+equals=percent%bang!",
    "quote'paren()star*semi;comma,at@dollar$amp&",
    "unicodé/日本語/emoji-\U0001F600",
    "double//slash/./dot/../seg",
]


class Origin:
    def __enter__(self):
        self.proc = subprocess.Popen([sys.executable, ORIGIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        line = self.proc.stdout.readline().decode().split()
        if len(line) != 3 or line[0] != "READY":
            raise RuntimeError("origin did not start: " + self.proc.stderr.read().decode())
        self.port, self.admin_port = int(line[1]), int(line[2])
        return self

    def __exit__(self, *exc):
        self.proc.stdin.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        err = self.proc.stderr.read().decode()
        if exc[0] is not None and err:
            print(err[-3000:], file=sys.stderr)
        self.proc.stdout.close()
        self.proc.stderr.close()

    def admin(self, method, path, obj=None):
        c = http.client.HTTPConnection("127.0.0.1", self.admin_port, timeout=10)
        body = json.dumps(obj).encode() if obj is not None else None
        c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        r = c.getresponse()
        data = r.read()
        c.close()
        assert r.status == 200, (path, r.status, data)
        return json.loads(data)

    def send(self, method, target, headers, body=b""):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            c.putheader(k, v)
        if "Content-Length" not in headers:
            c.putheader("Content-Length", str(len(body)))
        c.endheaders()
        if body:
            c.send(body)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data

    # SigV4 with botocore: the request botocore signs is the one sent, byte for byte.
    def sigv4(self, method, path, query="", body=b"", key=None, service="s3", unsigned=False, extra=None,
              tamper=None, when=None):
        key = key or self.key
        host = f"127.0.0.1:{self.port}"
        url = f"http://{host}{path}" + (f"?{query}" if query else "")
        req = AWSRequest(method=method, url=url, data=body, headers=dict(extra or {}))
        if unsigned:
            class S3Config:
                s3 = {"payload_signing_enabled": False}
            req.context["client_config"] = S3Config()
        signer_class = S3SigV4Auth if service == "s3" else SigV4Auth
        signer = signer_class(Credentials(key["id"], key["secret"], key.get("token")), service, "us-east-1")
        if when is None:
            signer.add_auth(req)
        else:
            import botocore.auth as ba
            saved = ba.get_current_datetime
            ba.get_current_datetime = lambda: when
            try:
                signer.add_auth(req)
            finally:
                ba.get_current_datetime = saved
        headers = {"Host": host}
        headers.update({k: v for k, v in req.headers.items()})
        if tamper:
            tamper(headers)
        return self.send(method, path + (f"?{query}" if query else ""), headers, body)


def code_of(data):
    text = data.decode()
    start = text.find("<Code>")
    return text[start + 6:text.find("</Code>")] if start >= 0 else None


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


def test_sigv4_s3_round_trips_and_refusals(o):
    o.key = {"id": "AKIDSELFTEST", "secret": "se/cr+et=" + "x" * 30, "token": "tok/en+=="}
    o.admin("POST", "/__admin/keys", o.key)
    for i, name in enumerate(HARD_KEYS):
        path = "/bucket/" + quote(name, safe="/~")
        body = f"body {i} of {name}".encode()
        st, _, data = o.sigv4("PUT", path, "a=1&a=&b&x%2Fy=%E6%97%A5", body=body, unsigned=(i % 2 == 1),
                              extra={"Content-Type": "text/plain"})
        expect(st == 200, f"PUT {name}: {st} {data[:400]}")
        st, _, data = o.sigv4("GET", path)
        expect(st == 200 and data == body, f"GET {name}: {st} {data[:200]}")
    objects = o.admin("GET", "/__admin/stats")["objects"]
    for name in HARD_KEYS:
        expect("s3:/bucket/" + name in objects, f"stored under the decoded name: {name} not in {list(objects)}")

    # A wrong secret, a tampered body, a header added after signing, an unknown key, a wrong token.
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", key=dict(o.key, secret="wrong"))
    expect(st == 403 and code_of(data) == "SignatureDoesNotMatch", f"wrong secret: {st} {data[:300]}")
    expect(b"<StringToSign>AWS4-HMAC-SHA256\n" in data and b"<CanonicalRequest>GET\n/bucket/plain.txt" in data, data[:600])
    st, _, data = o.sigv4("PUT", "/bucket/t", body=b"abc", tamper=lambda h: None)
    expect(st == 200, f"control: {st} {data[:300]}")
    req_body = b"abc"
    st, _, data = o.send("PUT", "/bucket/t", {**dict(), **_signed_headers(o, "PUT", "/bucket/t", req_body)}, b"abd")
    expect(st == 400 and code_of(data) == "XAmzContentSHA256Mismatch", f"tampered body: {st} {data[:300]}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", tamper=lambda h: h.update({"x-amz-meta-later": "1"}))
    expect(st == 403 and code_of(data) == "AccessDenied", f"unsigned x-amz field: {st} {data[:300]}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", extra={"Content-Type": "text/plain"},
                          tamper=lambda h: h.update({"Content-Type": "text/evil"}))
    expect(st == 403 and code_of(data) == "SignatureDoesNotMatch", f"signed header changed after signing: {st} {data[:300]}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", tamper=lambda h: h.update({"Content-Type": "text/unsigned"}))
    expect(st == 200, f"a field that was not signed may be added, as on S3: {st} {data[:300]}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", query="a=1", tamper=None)
    expect(st == 200, f"query control: {st}")
    st, _, data = o.send("GET", "/bucket/plain.txt?a=2", _signed_headers(o, "GET", "/bucket/plain.txt", b"", query="a=1"))
    expect(st == 403 and code_of(data) == "SignatureDoesNotMatch", f"query changed after signing: {st} {data[:300]}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", key=dict(o.key, id="AKIDUNKNOWN"))
    expect(st == 403 and code_of(data) == "InvalidAccessKeyId", f"unknown key: {st} {data[:300]}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", key=dict(o.key, token="other"))
    expect(st == 400 and code_of(data) == "InvalidToken", f"wrong token: {st} {data[:300]}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", key=dict(o.key, token=None))
    expect(st == 400 and code_of(data) == "InvalidToken", f"no token: {st} {data[:300]}")

    # Clock: a request signed 20 minutes ago is too skewed; ServerTime is the origin's clock.
    past = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=20)
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", when=past)
    expect(st == 403 and code_of(data) == "RequestTimeTooSkewed" and b"<ServerTime>" in data, f"skew: {st} {data[:300]}")
    o.admin("POST", "/__admin/clock", {"offset_seconds": 1800})
    st, headers, data = o.sigv4("GET", "/bucket/plain.txt")
    text = data.decode()
    server_time = text[text.find("<ServerTime>") + 12:text.find("</ServerTime>")]
    t = datetime.datetime.strptime(server_time, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
    expect(st == 403 and abs(t - (time.time() + 1800)) < 10, f"skewed origin: {st} {server_time}")
    st, _, data = o.sigv4("GET", "/bucket/plain.txt", when=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=30))
    expect(st == 200, f"signed in the origin's time: {st} {data[:300]}")
    o.admin("POST", "/__admin/clock", {"offset_seconds": 0})

    # Expiry, revocation, a wrong secret on the origin's side.
    o.admin("POST", "/__admin/expire", {"id": o.key["id"]})
    st, _, data = o.sigv4("GET", "/bucket/plain.txt")
    expect(st == 400 and code_of(data) == "ExpiredToken", f"expired: {st} {data[:300]}")
    o.admin("POST", "/__admin/keys", o.key)
    o.admin("POST", "/__admin/wrong_secret", {"id": o.key["id"]})
    st, _, data = o.sigv4("GET", "/bucket/plain.txt")
    expect(st == 403 and code_of(data) == "SignatureDoesNotMatch", f"origin's wrong secret: {st} {data[:300]}")
    o.admin("POST", "/__admin/revoke", {"id": o.key["id"]})
    st, _, data = o.sigv4("GET", "/bucket/plain.txt")
    expect(st == 403 and code_of(data) == "InvalidAccessKeyId", f"revoked: {st} {data[:300]}")
    st, _, data = o.sigv4("HEAD", "/bucket/plain.txt")
    expect(st == 403 and data == b"", f"HEAD refusal has no body: {st} {data[:100]}")


def _signed_headers(o, method, path, body, query=""):
    host = f"127.0.0.1:{o.port}"
    req = AWSRequest(method=method, url=f"http://{host}{path}" + (f"?{query}" if query else ""), data=body)
    S3SigV4Auth(Credentials(o.key["id"], o.key["secret"], o.key.get("token")), "s3", "us-east-1").add_auth(req)
    h = {"Host": host}
    h.update(dict(req.headers.items()))
    return h


def test_sigv4_other_service(o):
    key = {"id": "AKIDAPI", "secret": "api-secret"}
    o.admin("POST", "/__admin/keys", key)
    st, _, data = o.sigv4("POST", "/prod/a%20b/./c", query="q=1", body=b'{"x":1}', key=key, service="execute-api")
    expect(st == 200, f"execute-api: {st} {data[:400]}")
    st, _, data = o.sigv4("POST", "/prod/x", body=b"{}", key=dict(key, secret="no"), service="execute-api")
    expect(st == 403 and code_of(data) == "SignatureDoesNotMatch", f"execute-api wrong secret: {st}")


def oss_client(o, key, endpoint_host="127.0.0.1", cname=False):
    cfg = oss.config.load_default()
    cfg.credentials_provider = oss.credentials.StaticCredentialsProvider(key["id"], key["secret"], key.get("token"))
    cfg.region = "cn-hangzhou"
    cfg.endpoint = f"http://{endpoint_host}:{o.port}"
    cfg.retry_max_attempts = 1
    if cname:
        cfg.use_cname = True
    return oss.Client(cfg)


def oss_code(call):
    """The (code, status) of the service error `call` raises; (None, 200) if it succeeds."""
    try:
        call()
    except oss.exceptions.OperationError as e:
        err = e.unwrap()
        if not isinstance(err, oss.exceptions.ServiceError):
            raise
        return err.code, err.status_code
    return None, 200


def test_oss_sdk_round_trips_and_refusals(o):
    key = {"id": "STS.selftest", "secret": "oss/se+cret", "token": "oss-token/+=="}
    o.admin("POST", "/__admin/keys", key)
    client = oss_client(o, key)
    # (The SDK's HTTP transport removes dot segments from the URL after signing: no `.` keys here.)
    names = [n.replace("/./dot/../seg", "") for n in HARD_KEYS]
    for i, name in enumerate(names):
        body = f"oss body {i}".encode()
        client.put_object(oss.PutObjectRequest(bucket="bkt", key=name, body=body))
        got = client.get_object(oss.GetObjectRequest(bucket="bkt", key=name)).body.read()
        expect(got == body, f"OSS GET {name}: {got!r}")
    objects = o.admin("GET", "/__admin/stats")["objects"]
    for name in names:
        expect("oss:/bkt/" + name in objects, f"OSS stored under the decoded name: {name}")

    # The bucket's virtual host (custom domain): the path is the key, the bucket is signed.
    o.admin("POST", "/__admin/config", {"oss_vhost_bucket": "vbkt"})
    vclient = oss_client(o, key, endpoint_host="localhost", cname=True)
    vclient.put_object(oss.PutObjectRequest(bucket="vbkt", key="v key+", body=b"virtual"))
    expect("oss:/vbkt/v key+" in o.admin("GET", "/__admin/stats")["objects"], "virtual-hosted name")
    o.admin("POST", "/__admin/config", {"oss_vhost_bucket": None})

    bad = oss_client(o, dict(key, secret="wrong"))
    code, status = oss_code(lambda: bad.get_object(oss.GetObjectRequest(bucket="bkt", key="plain.txt")))
    expect((code, status) == ("SignatureDoesNotMatch", 403), f"OSS wrong secret: {code} {status}")
    other = oss_client(o, dict(key, token="other"))
    code, status = oss_code(lambda: other.get_object(oss.GetObjectRequest(bucket="bkt", key="plain.txt")))
    expect((code, status) == ("InvalidSecurityToken", 403), f"OSS wrong token: {code} {status}")
    o.admin("POST", "/__admin/clock", {"offset_seconds": -1800})
    code, status = oss_code(lambda: client.get_object(oss.GetObjectRequest(bucket="bkt", key="plain.txt")))
    expect((code, status) == ("RequestTimeTooSkewed", 403), f"OSS skew: {code} {status}")
    o.admin("POST", "/__admin/clock", {"offset_seconds": 0})
    o.admin("POST", "/__admin/expire", {"id": key["id"]})
    code, status = oss_code(lambda: client.get_object(oss.GetObjectRequest(bucket="bkt", key="plain.txt")))
    expect((code, status) == ("SecurityTokenExpired", 403), f"OSS expired: {code} {status}")
    o.admin("POST", "/__admin/revoke", {"id": key["id"]})
    code, status = oss_code(lambda: client.get_object(oss.GetObjectRequest(bucket="bkt", key="plain.txt")))
    expect((code, status) == ("InvalidAccessKeyId", 403), f"OSS revoked: {code} {status}")


def test_vending(o):
    o.admin("POST", "/__admin/vendor", {"name": "v", "shape": "container", "lifetime_seconds": 60})
    o.admin("POST", "/__admin/vendor", {"name": "a", "shape": "aliyun", "lifetime_seconds": 60})
    c = http.client.HTTPConnection("127.0.0.1", o.admin_port, timeout=10)
    c.request("GET", "/__vend/v")
    creds = json.loads(c.getresponse().read())
    c.request("GET", "/__vend/a")
    ali = json.loads(c.getresponse().read())
    c.close()
    expect(set(creds) >= {"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}, creds)
    expect(set(ali) == {"accessKeyId", "accessKeySecret", "securityToken", "expiration"}, ali)
    key = {"id": creds["AccessKeyId"], "secret": creds["SecretAccessKey"], "token": creds["Token"]}
    st, _, data = o.sigv4("PUT", "/bucket/vended", body=b"v", key=key)
    expect(st == 200, f"vended keys work: {st} {data[:300]}")
    expect(o.admin("GET", "/__admin/stats")["vend_calls"] == {"v": 1, "a": 1}, "vending counted")
    o.admin("POST", "/__admin/revoke", {"vendor": "v"})
    st, _, data = o.sigv4("PUT", "/bucket/vended", body=b"v", key=key)
    expect(st == 403 and code_of(data) == "InvalidAccessKeyId", f"vendor's keys revoked: {st}")
    # A big body is kept as its hash only.
    key2 = {"id": "AKIDBIG", "secret": "big"}
    o.admin("POST", "/__admin/keys", key2)
    big = os.urandom(3 * 1024 * 1024 + 5)
    st, _, data = o.sigv4("PUT", "/bucket/big", body=big, key=key2, unsigned=True)
    expect(st == 200, f"big PUT: {st} {data[:300]}")
    info = o.admin("GET", "/__admin/stats")["objects"]["s3:/bucket/big"]
    expect(info == {"length": len(big), "sha256": hashlib.sha256(big).hexdigest(), "kept": False}, info)


def main():
    tests = [test_sigv4_s3_round_trips_and_refusals, test_sigv4_other_service, test_oss_sdk_round_trips_and_refusals, test_vending]
    failed = 0
    for t in tests:
        with Origin() as o:
            try:
                t(o)
                print(f"ok   {t.__name__}")
            except Exception:
                failed += 1
                print(f"FAIL {t.__name__}")
                traceback.print_exc()
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
