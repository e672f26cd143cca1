#!/usr/bin/env python3
"""Self-test of oauth_server.py over real HTTP (urllib only).

    python3 Tests/Fixtures/test_oauth_server.py      # plain script, exits non-zero on failure
    python3 -m pytest Tests/Fixtures/test_oauth_server.py   # also works when pytest is installed
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "oauth_server.py")


class Server:
    """Runs oauth_server.py in a child process for the duration of a `with` block."""

    def __init__(self, *flags):
        self.flags = list(flags)

    def __enter__(self):
        self.dir = tempfile.TemporaryDirectory()
        port_file = os.path.join(self.dir.name, "port")
        self.proc = subprocess.Popen(
            [sys.executable, SERVER, "--port", "0", "--port-file", port_file, *self.flags],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.time() + 10
        while not os.path.exists(port_file):
            if self.proc.poll() is not None:
                raise RuntimeError("server exited: " + self.proc.stderr.read().decode())
            if time.time() > deadline:
                self.proc.kill()
                raise RuntimeError("server did not write its port file")
            time.sleep(0.05)
        with open(port_file) as f:
            self.port = int(f.read().strip())
        self.base = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc.stderr.close()
        self.dir.cleanup()

    def request(self, method, path, form=None, body=None, headers=None):
        """Returns (status, headers, parsed JSON body or raw bytes)."""
        headers = dict(headers or {})
        data = body
        if form is not None:
            data = urllib.parse.urlencode(form).encode()
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                status, hdrs, raw = r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            status, hdrs, raw = e.code, e.headers, e.read()
        try:
            return status, hdrs, json.loads(raw)
        except ValueError:
            return status, hdrs, raw

    def token(self, form, basic=None):
        headers = {}
        if basic is not None:
            headers["Authorization"] = basic_header(*basic)
        return self.request("POST", "/oauth/token", form=form, headers=headers)

    def api(self, token, path="/api/thing", method="GET", body=None):
        headers = {} if token is None else {"Authorization": "Bearer " + token}
        return self.request(method, path, body=body, headers=headers)


def basic_header(client_id, secret, encode=True):
    """RFC 6749 §2.3.1: form-urlencode each part, then base64."""
    if encode:
        client_id, secret = urllib.parse.quote_plus(client_id), urllib.parse.quote_plus(secret)
    return "Basic " + base64.b64encode(f"{client_id}:{secret}".encode()).decode()


def ok_token(resp):
    status, _, body = resp
    assert status == 200, resp
    assert body["token_type"] == "Bearer", body
    assert isinstance(body["access_token"], str) and len(body["access_token"]) >= 32, body
    return body


# ---------------------------------------------------------------------------------------


def test_client_credentials_basic_and_post_and_api():
    with Server() as s:
        t = ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        assert t["expires_in"] == 3600 and "refresh_token" not in t and t["scope"] == "read write"
        status, _, body = s.api(t["access_token"], "/api/a/b?x=1")
        assert status == 200, body
        assert body["path"] == "/api/a/b" and body["method"] == "GET" and body["query"] == "x=1"
        assert body["client_id"] == "svc" and body["scope"] == "read write"
        assert body["body_length"] == 0 and body["body_sha256"] == hashlib.sha256(b"").hexdigest()

        t2 = ok_token(
            s.token({"grant_type": "client_credentials", "client_id": "svc-post", "client_secret": "post-secret", "scope": "read"})
        )
        assert t2["scope"] == "read"
        status, _, body = s.api(t2["access_token"])
        assert status == 200 and body["client_id"] == "svc-post"

        # Each client only with its registered method.
        status, _, body = s.token({"grant_type": "client_credentials", "client_id": "svc", "client_secret": "svc-secret"})
        assert status in (400, 401) and body["error"] == "invalid_client", body
        status, _, body = s.token({"grant_type": "client_credentials"}, basic=("svc-post", "post-secret"))
        assert status == 401 and body["error"] == "invalid_client", body
        status, _, body = s.token({"grant_type": "client_credentials"}, basic=("svc", "nope"))
        assert status == 401 and body["error"] == "invalid_client", body
        # Unknown scope, wrong grant for the client, unknown grant type.
        status, _, body = s.token({"grant_type": "client_credentials", "scope": "root"}, basic=("svc", "svc-secret"))
        assert status == 400 and body["error"] == "invalid_scope", body
        status, _, body = s.token({"grant_type": "password", "username": "alice", "password": "wonderland"}, basic=("svc", "svc-secret"))
        assert status == 400 and body["error"] == "unauthorized_client", body
        status, _, body = s.token({"grant_type": "urn:x"}, basic=("svc", "svc-secret"))
        assert status == 400 and body["error"] == "unsupported_grant_type", body


def test_weird_secret_requires_urlencoding_before_base64():
    with Server() as s:
        t = ok_token(s.token({"grant_type": "client_credentials"}, basic=("we:ird", "p@ss w+rd/:")))
        status, _, body = s.api(t["access_token"])
        assert status == 200 and body["client_id"] == "we:ird"
        # Percent-encoded space (%20) is form-urldecoded the same way.
        hdr = "Basic " + base64.b64encode(b"we%3Aird:p%40ss%20w%2Brd%2F%3A").decode()
        ok_token(s.request("POST", "/oauth/token", form={"grant_type": "client_credentials"}, headers={"Authorization": hdr}))
        # Without the encoding it must fail.
        hdr = basic_header("we:ird", "p@ss w+rd/:", encode=False)
        status, _, body = s.request("POST", "/oauth/token", form={"grant_type": "client_credentials"}, headers={"Authorization": hdr})
        assert status == 401 and body["error"] == "invalid_client", body


def test_password_grant_and_refresh_without_rotation():
    with Server("--token-lifetime", "120") as s:
        t = ok_token(s.token({"grant_type": "password", "username": "alice", "password": "wonderland"}, basic=("app", "app-secret")))
        assert t["expires_in"] == 120 and t["refresh_token"]
        status, _, body = s.api(t["access_token"])
        assert status == 200 and body["user"] == "alice" and body["client_id"] == "app"
        status, _, body = s.token({"grant_type": "password", "username": "alice", "password": "x"}, basic=("app", "app-secret"))
        assert status == 400 and body["error"] == "invalid_request", body

        # Public client cli: password grant, then refresh with no client secret.
        c = ok_token(s.token({"grant_type": "password", "client_id": "cli", "username": "alice", "password": "wonderland"}))
        r1 = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": c["refresh_token"]}))
        assert "refresh_token" not in r1 and r1["access_token"] != c["access_token"]
        r2 = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": c["refresh_token"]}))
        assert r2["access_token"] != r1["access_token"]
        # A refresh token is bound to its client.
        status, _, body = s.token({"grant_type": "refresh_token", "refresh_token": c["refresh_token"]}, basic=("app", "app-secret"))
        assert status == 400 and body["error"] == "invalid_grant", body
        # Nothing rotates here, so nothing is ever reused.
        assert s.request("GET", "/_test/stats")[2]["refresh_token_reuses"] == 0
        status, _, body = s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": "garbage"})
        assert status == 400 and body["error"] == "invalid_grant", body


def test_issue_refresh_token_hook():
    with Server() as s:
        status, _, body = s.request("POST", "/_test/issue-refresh-token?client_id=cli&user=alice")
        assert status == 200 and body["refresh_token"], body
        t = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": body["refresh_token"]}))
        status, _, api = s.api(t["access_token"])
        assert status == 200 and api["user"] == "alice" and api["client_id"] == "cli"
        status, _, body = s.request("POST", "/_test/issue-refresh-token?client_id=svc&user=alice")
        assert status == 400, body


def test_revocation_and_invalid_token():
    with Server() as s:
        status, hdrs, body = s.api(None)
        assert status == 401 and hdrs["WWW-Authenticate"].startswith("Bearer "), (status, dict(hdrs))
        assert 'error="invalid_token"' in hdrs["WWW-Authenticate"], dict(hdrs)
        status, hdrs, _ = s.request("GET", "/api/x", headers={"Authorization": "Basic Zm9vOmJhcg=="})
        assert status == 401 and 'Bearer error="invalid_token"' in hdrs["WWW-Authenticate"], dict(hdrs)
        status, hdrs, _ = s.api("not-a-token")
        assert status == 401 and 'error="invalid_token"' in hdrs["WWW-Authenticate"], dict(hdrs)

        t = ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        status, _, _ = s.request("POST", "/oauth/revoke", form={"token": t["access_token"]}, headers={"Authorization": basic_header("svc", "svc-secret")})
        assert status == 200
        status, hdrs, _ = s.api(t["access_token"])
        assert status == 401 and 'error="invalid_token"' in hdrs["WWW-Authenticate"], dict(hdrs)

        # Revoking a refresh token (public client) kills it and its access token.
        status, _, seed = s.request("POST", "/_test/issue-refresh-token?client_id=cli&user=alice")
        r = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": seed["refresh_token"]}))
        status, _, _ = s.request("POST", "/oauth/revoke", form={"token": seed["refresh_token"], "token_type_hint": "refresh_token", "client_id": "cli"})
        assert status == 200
        status, _, body = s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": seed["refresh_token"]})
        assert status == 400 and body["error"] == "invalid_grant", body
        # (the access token from the refresh is a separate record and stays valid)
        assert s.api(r["access_token"])[0] == 200

        # revoke-all hook
        a = ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        b = ok_token(s.token({"grant_type": "client_credentials", "client_id": "svc-post", "client_secret": "post-secret"}))
        status, _, body = s.request("POST", "/_test/revoke-all")
        assert status == 200 and body["revoked"] >= 2, body
        for tok in (a, b, r):
            status, hdrs, _ = s.api(tok["access_token"])
            assert status == 401 and 'error="invalid_token"' in hdrs["WWW-Authenticate"]


def test_expiry():
    with Server("--token-lifetime", "1") as s:
        t = ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        assert t["expires_in"] == 1
        assert s.api(t["access_token"])[0] == 200
        time.sleep(1.2)
        status, hdrs, _ = s.api(t["access_token"])
        assert status == 401 and 'error="invalid_token"' in hdrs["WWW-Authenticate"]


def test_no_expires_in_when_lifetime_zero():
    with Server("--token-lifetime", "0") as s:
        t = ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        assert "expires_in" not in t
        assert s.api(t["access_token"])[0] == 200


def test_rotation_with_grace():
    with Server("--rotate-refresh-tokens", "--grace-seconds", "2") as s:
        status, _, seed = s.request("POST", "/_test/issue-refresh-token?client_id=cli&user=alice")
        old = seed["refresh_token"]
        r1 = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": old}))
        assert r1["refresh_token"] and r1["refresh_token"] != old
        # Same old token within the grace window: the same pair again.
        r1b = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": old}))
        assert r1b["access_token"] == r1["access_token"] and r1b["refresh_token"] == r1["refresh_token"]
        # The new one works and rotates again.
        r2 = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": r1["refresh_token"]}))
        assert r2["refresh_token"] not in (old, r1["refresh_token"])
        time.sleep(2.3)
        status, _, body = s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": old})
        assert status == 400 and body["error"] == "invalid_grant", body
        status, _, body = s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": r1["refresh_token"]})
        assert status == 400 and body["error"] == "invalid_grant", body
        ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": r2["refresh_token"]}))
        assert s.request("GET", "/_test/stats")[2]["grace_replays"] == 1


def test_rotation_without_grace():
    with Server("--rotate-refresh-tokens", "--grace-seconds", "0") as s:
        c = ok_token(s.token({"grant_type": "password", "username": "alice", "password": "wonderland"}, basic=("app", "app-secret")))
        r1 = ok_token(s.token({"grant_type": "refresh_token", "refresh_token": c["refresh_token"]}, basic=("app", "app-secret")))
        assert r1["refresh_token"] != c["refresh_token"]
        assert s.request("GET", "/_test/stats")[2]["refresh_token_reuses"] == 0
        status, _, body = s.token({"grant_type": "refresh_token", "refresh_token": c["refresh_token"]}, basic=("app", "app-secret"))
        assert status == 400 and body["error"] == "invalid_grant", body
        # The rotated token presented again: what reuse detection takes as theft.
        assert s.request("GET", "/_test/stats")[2]["refresh_token_reuses"] == 1


def test_large_body():
    with Server() as s:
        t = ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        data = os.urandom(3 * 1024 * 1024 + 7)
        status, _, body = s.api(t["access_token"], "/api/upload", method="POST", body=data)
        assert status == 200, body
        assert body["body_length"] == len(data) and body["body_sha256"] == hashlib.sha256(data).hexdigest()
        assert body["method"] == "POST"
        status, _, body = s.api(t["access_token"], "/api/x", method="PUT", body=b"abc")
        assert status == 200 and body["method"] == "PUT" and body["body_length"] == 3


def test_stats():
    with Server() as s:
        ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        ok_token(s.token({"grant_type": "client_credentials"}, basic=("svc", "svc-secret")))
        s.token({"grant_type": "client_credentials"}, basic=("svc", "bad"))
        t = ok_token(s.token({"grant_type": "password", "client_id": "cli", "username": "alice", "password": "wonderland"}))
        ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": t["refresh_token"]}))
        s.api(t["access_token"])
        s.api("bogus")
        status, _, st = s.request("GET", "/_test/stats")
        assert status == 200
        assert st["token_requests"] == 5, st
        assert st["by_grant"] == {"client_credentials": 3, "password": 1, "refresh_token": 1}, st
        assert st["by_client"] == {"svc": 3, "cli": 2}, st
        assert st["token_errors"] == {"invalid_client": 1}, st
        assert st["tokens_issued"] == 4, st
        assert st["api_requests"] == 2 and st["api_rejected"] == 1, st
        assert s.request("POST", "/_test/reset-stats")[0] == 200
        st = s.request("GET", "/_test/stats")[2]
        assert st["token_requests"] == 0 and st["by_grant"] == {} and st["api_requests"] == 0, st


def test_fail_next_and_configure():
    with Server() as s:
        assert s.request("POST", "/_test/fail-next?count=2&status=503&retry_after=1")[0] == 200
        creds = ("svc", "svc-secret")
        for _ in range(2):
            status, hdrs, body = s.token({"grant_type": "client_credentials"}, basic=creds)
            assert status == 503 and hdrs["Retry-After"] == "1" and body["error"] == "temporarily_unavailable", body
        ok_token(s.token({"grant_type": "client_credentials"}, basic=creds))
        s.request("POST", "/_test/fail-next?status=200&error=")
        status, _, body = s.token({"grant_type": "client_credentials"}, basic=creds)
        assert status == 200 and body == {}, body
        s.request("POST", "/_test/fail-next?status=400&error=invalid_client&delay=0.3")
        t0 = time.time()
        status, _, body = s.token({"grant_type": "client_credentials"}, basic=creds)
        assert status == 400 and body["error"] == "invalid_client" and time.time() - t0 >= 0.3
        s.request("POST", "/_test/fail-next?count=5")
        s.request("POST", "/_test/clear-faults")
        ok_token(s.token({"grant_type": "client_credentials"}, basic=creds))
        st = s.request("GET", "/_test/stats")[2]
        assert st["injected_faults"] == 4 and st["token_errors"] == {"temporarily_unavailable": 2, "invalid_client": 1}, st

        status, _, cfg = s.request("POST", "/_test/configure?token_lifetime=7&rotate_refresh_tokens=1")
        assert status == 200 and cfg["token_lifetime"] == 7 and cfg["rotate_refresh_tokens"] is True, cfg
        t = ok_token(s.token({"grant_type": "password", "client_id": "cli", "username": "bob", "password": "builder"}))
        assert t["expires_in"] == 7
        r = ok_token(s.token({"grant_type": "refresh_token", "client_id": "cli", "refresh_token": t["refresh_token"]}))
        assert r["refresh_token"] != t["refresh_token"]


def test_keep_alive_http11():
    import http.client

    with Server() as s:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=5)
        hdr = {"Authorization": basic_header("svc", "svc-secret"), "Content-Type": "application/x-www-form-urlencoded"}
        conn.request("POST", "/oauth/token", body="grant_type=client_credentials", headers=hdr)
        r = conn.getresponse()
        tok = json.loads(r.read())["access_token"]
        assert r.version == 11
        for _ in range(3):
            conn.request("GET", "/api/k", headers={"Authorization": "Bearer " + tok})
            r = conn.getresponse()
            assert r.status == 200 and json.loads(r.read())["path"] == "/api/k"
        conn.close()


if __name__ == "__main__":
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, fn in tests:
        t0 = time.time()
        try:
            fn()
            print(f"PASS {name} ({time.time() - t0:.1f}s)")
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    print(f"{len(tests) - failed}/{len(tests)} passed")
    sys.exit(1 if failed else 0)
