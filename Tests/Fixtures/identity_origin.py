#!/usr/bin/env python3
"""An upstream that tells who is calling, for bearerd's on-behalf-of tests (docs/architecture.md
§6.16). TEST FIXTURE ONLY; binds 127.0.0.1.

    python3 identity_origin.py --sts-jwks http://127.0.0.1:STS/jwks [--caller-issuer ISS]

Prints `READY <port>` and exits when stdin closes.

Every request other than /control/* needs `Authorization: Bearer <JWT>` signed by the STS
(exchange_sts.py; its keys fetched from --sts-jwks at the first request, verified with PyJWT:
ES256, `exp`). Valid: 200 JSON {"sub", "aud", "act", "jti", "path", "method", "scheme", "jkt"}.
Missing, invalid, expired or revoked: 401 with `WWW-Authenticate: Bearer error="invalid_token"`.

DPoP (RFC 9449 §7): a token with `cnf.jkt` (bound by the STS) is accepted only as
`Authorization: DPoP <token>` with exactly one `DPoP` proof, verified by dpop_common.py (joserfc:
signature with the embedded JWK, typ, alg, htm = the method, htu = http://<Host><path> (no
query), iat window, unique jti, ath = SHA-256 of the token) whose key's thumbprint equals the
token's `cnf.jkt`. A bound token sent as Bearer, without a proof, with a failing proof or another
key, and an unbound token sent as DPoP: 401 `WWW-Authenticate: DPoP error="invalid_token"` (or
"invalid_dpop_proof"). While a nonce is demanded (/control/dpop_nonce), a proof without the
current one gets 401 `DPoP error="use_dpop_nonce"` with `DPoP-Nonce` (RFC 9449 §9).

Every request's headers are recorded. A token whose unverified `iss` is --caller-issuer (a
caller's own token from the IdP) is counted in `caller_tokens_seen`, wherever it appears in a
header value.

- `GET /control/log` -> {"requests": [{"path", "status", "sub", "jti", "scheme", "jkt", "error",
  "headers": [[k, v]...]}], "caller_tokens_seen": N, "by_sub": {sub: 200-count},
  "dpop_ok": N (requests whose proof and binding verified), "nonce_demands": N}
  (`jkt`: the verified proof key's thumbprint; `error`: why a request was refused)
- `POST /control/revoke?sub=S` -> revokes every STS token of S this origin has seen so far (their
  jti); later tokens of S (a new exchange) are accepted.
- `POST /control/dpop_nonce?on=1|0` -> on: demand a new nonce in every proof from now on; off: none.
- `POST /control/reset` -> clears the log and counts (not the revocations).
"""
import json
import secrets
import sys
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import jwt
from jwt.algorithms import ECAlgorithm

try:  # joserfc: only DPoP requests need it (the other tests' prerequisite is PyJWT alone)
    import dpop_common
except ImportError:  # pragma: no cover
    dpop_common = None


class Refused(Exception):
    """A 401: `scheme` of the challenge, RFC 6750/9449 `error`, extra headers."""

    def __init__(self, detail, scheme="Bearer", error="invalid_token", headers=()):
        super().__init__(detail)
        self.scheme, self.error, self.headers = scheme, error, list(headers)


class State:
    """Keys, log, revocations. Guarded by `lock`."""

    def __init__(self, jwks_url, caller_issuer):
        self.lock = threading.Lock()
        self.jwks_url = jwks_url
        self.caller_issuer = caller_issuer
        self.keys = None
        self.log = []
        self.seen = {}  # sub -> set of jti seen
        self.revoked = set()
        self.caller_tokens_seen = 0
        self.by_sub = {}
        self.dpop_ok = 0
        self.nonce_demands = 0
        self.dpop_nonce = None  # the nonce every proof must carry, when demanded
        self.jtis = dpop_common.JtiCache() if dpop_common else None

    def check_dpop(self, scheme, token, claims, headers, method, path):
        """RFC 9449 §7: the proof key's thumbprint for a bound token sent as DPoP, None for an
        unbound token sent as Bearer; raises Refused otherwise."""
        bound = (claims.get("cnf") or {}).get("jkt")
        if scheme == "Bearer":
            if bound is not None:
                raise Refused("a DPoP-bound token sent as Bearer", scheme="DPoP")
            return None
        if bound is None:
            raise Refused("an unbound token sent as DPoP", scheme="DPoP")
        proofs = headers.get_all("DPoP") or []
        if len(proofs) != 1:
            raise Refused("exactly one DPoP proof expected, got %d" % len(proofs), scheme="DPoP",
                          error="invalid_dpop_proof")
        if dpop_common is None:
            raise Refused("this fixture has no joserfc to check proofs", scheme="DPoP", error="invalid_dpop_proof")
        with self.lock:
            nonce = self.dpop_nonce
        htu = "http://%s%s" % (headers.get("Host"), urlparse(path).path)
        try:
            _, jkt = dpop_common.verify_proof(proofs[0], method, htu, self.jtis, access_token=token, nonce=nonce)
        except dpop_common.ProofError as e:
            if e.error == "use_dpop_nonce":
                with self.lock:
                    self.nonce_demands += 1
                raise Refused(e.description, scheme="DPoP", error="use_dpop_nonce", headers=[("DPoP-Nonce", nonce)]) from None
            raise Refused(e.description, scheme="DPoP", error="invalid_dpop_proof") from None
        if jkt != bound:
            raise Refused("proof key %s is not the token's cnf.jkt %s" % (jkt, bound), scheme="DPoP")
        return jkt

    def key(self, kid):
        with self.lock:
            keys = self.keys
        if keys is None or kid not in keys:
            with urllib.request.urlopen(self.jwks_url, timeout=5) as r:
                doc = json.load(r)
            keys = {k["kid"]: ECAlgorithm.from_jwk(json.dumps(k)) for k in doc["keys"]}
            with self.lock:
                self.keys = keys
        return keys.get(kid)

    def looks_like_caller(self, value):
        for word in value.replace(",", " ").split():
            if word.count(".") != 2:
                continue
            try:
                claims = jwt.decode(word, options={"verify_signature": False})
            except Exception:
                continue
            if self.caller_issuer and claims.get("iss") == self.caller_issuer:
                return True
        return False


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, *args):
        pass

    def reply(self, status, obj, headers=()):
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self, method):
        st = self.state
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        u = urlparse(self.path)
        if u.path.startswith("/control/"):
            q = {k: v[0] for k, v in parse_qs(u.query).items()}
            with st.lock:
                if method == "GET" and u.path == "/control/log":
                    return self.reply(200, {"requests": list(st.log), "caller_tokens_seen": st.caller_tokens_seen,
                                            "by_sub": dict(st.by_sub), "dpop_ok": st.dpop_ok,
                                            "nonce_demands": st.nonce_demands})
                if method == "POST" and u.path == "/control/revoke":
                    st.revoked |= st.seen.get(q.get("sub"), set())
                    return self.reply(200, {"revoked": len(st.seen.get(q.get("sub"), set()))})
                if method == "POST" and u.path == "/control/reset":
                    st.log, st.caller_tokens_seen, st.by_sub = [], 0, {}
                    st.dpop_ok, st.nonce_demands = 0, 0
                    return self.reply(200, {"ok": True})
                if method == "POST" and u.path == "/control/dpop_nonce":
                    st.dpop_nonce = secrets.token_urlsafe(16) if q.get("on", "1") == "1" else None
                    return self.reply(200, {"ok": True})
            return self.reply(404, {"error": "not_found"})
        headers = [[k, v] for k, v in self.headers.items()]
        caller_seen = any(st.looks_like_caller(v) for _, v in headers)
        entry = {"path": self.path, "method": method, "headers": headers, "sub": None, "jti": None, "status": 401,
                 "scheme": None, "jkt": None, "error": None}
        try:
            auth = self.headers.get_all("Authorization") or []
            scheme = auth[0].split(" ", 1)[0] if len(auth) == 1 else None
            if scheme not in ("Bearer", "DPoP"):
                raise ValueError("exactly one Bearer or DPoP Authorization expected, got %d" % len(auth))
            entry["scheme"] = scheme
            token = auth[0][len(scheme) + 1:].strip()
            kid = jwt.get_unverified_header(token).get("kid")
            key = st.key(kid)
            if key is None:
                raise ValueError("unknown kid")
            claims = jwt.decode(token, key, algorithms=["ES256"], options={"verify_aud": False, "require": ["exp", "sub", "jti"]})
            jkt = st.check_dpop(scheme, token, claims, self.headers, method, self.path)
            entry["jkt"] = jkt
            with st.lock:
                if claims["jti"] in st.revoked:
                    raise ValueError("revoked")
                st.seen.setdefault(claims["sub"], set()).add(claims["jti"])
            entry.update(sub=claims["sub"], jti=claims["jti"], status=200)
            body = {"sub": claims["sub"], "aud": claims.get("aud"), "act": claims.get("act"), "jti": claims["jti"],
                    "path": self.path, "method": method, "scheme": scheme, "jkt": jkt}
            status, extra = 200, []
        except Refused as e:
            body = {"error": e.error, "detail": str(e)}
            status = 401
            extra = [("WWW-Authenticate", '%s error="%s"' % (e.scheme, e.error))] + e.headers
            entry["error"] = "%s: %s" % (e.error, e)
        except Exception as e:  # noqa: BLE001 (any failure is the caller's 401)
            body = {"error": "invalid_token", "detail": str(e)}
            status = 401
            extra = [("WWW-Authenticate", 'Bearer error="invalid_token"')]
            entry["error"] = "invalid_token: %s" % e
        with st.lock:
            st.log.append(entry)
            if caller_seen:
                st.caller_tokens_seen += 1
            if status == 200:
                st.by_sub[entry["sub"]] = st.by_sub.get(entry["sub"], 0) + 1
                if entry["jkt"] is not None:
                    st.dpop_ok += 1
        self.reply(status, body, extra)

    def do_GET(self):  # noqa: N802
        self.handle_any("GET")

    def do_POST(self):  # noqa: N802
        self.handle_any("POST")

    def do_PUT(self):  # noqa: N802
        self.handle_any("PUT")


def main():
    args = sys.argv[1:]
    jwks_url, caller_issuer = None, None
    while args:
        a = args.pop(0)
        if a == "--sts-jwks":
            jwks_url = args.pop(0)
        elif a == "--caller-issuer":
            caller_issuer = args.pop(0)
        else:
            raise SystemExit("unknown argument %s" % a)
    if not jwks_url:
        raise SystemExit("--sts-jwks is required")
    state = State(jwks_url, caller_issuer)
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("H", (Handler,), {"state": state}))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("READY %d" % server.server_address[1], flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
