#!/usr/bin/env python3
"""Self-test of exchange_sts.py and identity_origin.py over real HTTP (urllib only): the STS
refuses every forged or foreign caller token, so a bearerd test that passes through it proves
the exchange was done with the caller's real token.

    python3 Tests/Fixtures/test_exchange_sts.py      # plain script, exits non-zero on failure
"""
import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TE = "urn:ietf:params:oauth:grant-type:token-exchange"
JB = "urn:ietf:params:oauth:grant-type:jwt-bearer"
AT = "urn:ietf:params:oauth:token-type:access_token"


class Child:
    def __init__(self, script, *args):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, script), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()
        if not line or line[0] != "READY":
            raise SystemExit("%s did not start: %s" % (script, self.proc.stderr.read()))
        self.ports = [int(p) for p in line[1:]]

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(5)


def call(method, url, form=None, headers=None):
    data = urllib.parse.urlencode(form, doseq=True).encode() if form is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if form is not None:
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            status, body = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read()
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body.decode()


def basic(cid, secret):
    return {"Authorization": "Basic " + base64.b64encode(("%s:%s" % (cid, secret)).encode()).decode()}


def main():
    sts = Child("exchange_sts.py")
    sts_port, idp_port = sts.ports
    S, I = "http://127.0.0.1:%d" % sts_port, "http://127.0.0.1:%d" % idp_port
    issuer = "http://127.0.0.1:%d/" % idp_port
    origin = Child("identity_origin.py", "--sts-jwks", S + "/jwks", "--caller-issuer", issuer)
    O = "http://127.0.0.1:%d" % origin.ports[0]
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    try:
        mint = lambda **q: call("GET", I + "/control/mint?" + urllib.parse.urlencode(q))[1]  # noqa: E731
        alice = mint(sub="alice")
        exchange = {"grant_type": TE, "subject_token": alice, "subject_token_type": AT, "audience": "https://orders"}
        st, tok = call("POST", S + "/token", exchange, basic("sidecar", "sidecar-secret"))
        check(st == 200 and tok.get("issued_token_type") == AT, "exchange with client_secret_basic")
        st, tok2 = call("POST", S + "/token", dict(exchange, client_id="sidecar", client_secret="sidecar-secret"))
        check(st == 200, "exchange with client_secret_post")
        st, body = call("POST", S + "/token", exchange, basic("sidecar", "wrong"))
        check(st == 401 and body.get("error") == "invalid_client", "wrong secret is invalid_client")
        st, body = call("POST", S + "/token", exchange, basic("svc", "svc-secret"))
        check(st == 400 and body.get("error") == "unauthorized_client", "svc may not exchange")
        for name, q in [("bad signature", dict(forge="bad_signature")), ("alg none", dict(forge="none")),
                        ("HS256 with the public key", dict(forge="hs256")), ("unknown kid", dict(forge="unknown_kid")),
                        ("wrong issuer", dict(iss="https://evil.example/")), ("wrong audience", dict(aud="other")),
                        ("expired", dict(exp_in=-60)), ("not yet valid", dict(nbf_in=120))]:
            st, body = call("POST", S + "/token", dict(exchange, subject_token=mint(sub="mallory", **q)),
                            basic("sidecar", "sidecar-secret"))
            check(st == 400 and body.get("error") == "invalid_grant", "refused: %s (%s)" % (name, body))
        st, body = call("POST", S + "/token", dict(grant_type=JB, assertion=alice), basic("sidecar", "sidecar-secret"))
        check(st == 400 and body.get("error") == "invalid_request", "on-behalf-of needs requested_token_use")
        st, obo = call("POST", S + "/token", dict(grant_type=JB, assertion=alice, requested_token_use="on_behalf_of",
                                                  scope="orders.read"), basic("sidecar", "sidecar-secret"))
        check(st == 200, "on-behalf-of with requested_token_use")
        st, cc = call("POST", S + "/token", dict(grant_type="client_credentials"), basic("svc", "svc-secret"))
        check(st == 200, "client_credentials for svc")
        call("POST", S + "/control/refuse?sub=alice&error=invalid_request")
        st, body = call("POST", S + "/token", exchange, basic("sidecar", "sidecar-secret"))
        check(st == 400 and body.get("error") == "invalid_request", "forced refusal")
        call("POST", S + "/control/refuse?sub=alice&on=0")
        call("POST", S + "/control/outage?on=1")
        st, body = call("POST", S + "/token", exchange, basic("sidecar", "sidecar-secret"))
        check(st == 503, "forced outage")
        call("POST", S + "/control/outage?on=0")
        st, stats = call("GET", S + "/control/stats")
        check(stats["exchanges"] == {"alice": 3}, "exchanges counted per caller: %s" % stats["exchanges"])
        check(stats["requests"] == len(stats["log"]) == 17, "every request logged (%d)" % stats["requests"])

        # The origin: STS tokens only; the caller's own token is refused and counted.
        st, body = call("GET", O + "/x", headers={"Authorization": "Bearer " + tok["access_token"]})
        check(st == 200 and body["sub"] == "alice" and body["act"] == {"sub": "sidecar"}, "origin accepts the exchanged token")
        st, body = call("GET", O + "/x", headers={"Authorization": "Bearer " + cc["access_token"]})
        check(st == 200 and body["sub"] == "svc", "origin accepts the service token")
        st, _ = call("GET", O + "/x", headers={"Authorization": "Bearer " + alice})
        check(st == 401, "origin refuses the caller's own token")
        st, _ = call("GET", O + "/x")
        check(st == 401, "origin refuses no token")
        call("POST", O + "/control/revoke?sub=alice")
        st, _ = call("GET", O + "/x", headers={"Authorization": "Bearer " + tok["access_token"]})
        check(st == 401, "origin refuses a revoked token")
        st, _ = call("GET", O + "/x", headers={"Authorization": "Bearer " + obo["access_token"]})
        check(st == 200, "a token of alice not yet seen is still good")
        st, log = call("GET", O + "/control/log")
        check(log["caller_tokens_seen"] == 1, "the caller's token is detected at the origin")

        # Key rotation: the old kid stays, the new one signs; the STS follows.
        kid = call("POST", I + "/control/rotate")[1]["kid"]
        fresh = mint(sub="carol")
        check(json.loads(base64.urlsafe_b64decode(fresh.split(".")[0] + "==")).get("kid") == kid, "rotation signs with the new kid")
        st, _ = call("POST", S + "/token", dict(exchange, subject_token=fresh), basic("sidecar", "sidecar-secret"))
        check(st == 200, "the STS accepts the rotated key")
        st, stats = call("GET", I + "/control/stats")
        check(stats["kids"] == ["k1", "k2"], "both kids published")
        many = call("GET", I + "/control/mint_many?prefix=u&count=3&pad=500")[1]
        check(len(many) == 3 and all(len(t) > 1000 for t in many), "mint_many with padding")
    finally:
        origin.stop()
        sts.stop()
    if failures:
        raise SystemExit("%d failures" % len(failures))
    print("all ok")


if __name__ == "__main__":
    main()
