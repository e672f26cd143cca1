#!/usr/bin/env python3
"""A strict security token service (RFC 8693 token exchange, RFC 7523 on-behalf-of) and the
callers' identity provider, for bearerd's on-behalf-of tests (docs/architecture.md §6.16).
TEST FIXTURE ONLY; binds 127.0.0.1. Independent of bearerd's code: callers' JWTs are verified
with PyJWT on pyca/cryptography.

    python3 exchange_sts.py [--delay SECONDS] [--lifetime SECONDS]

Prints `READY <sts_port> <idp_port>` and exits when stdin closes.

Why a fixture and not a packaged server: Authlib 1.9.9's `authlib.oauth2.rfc8693` is a docstring
only (no grant), and neither oauthlib 3.3 nor django-oauth-toolkit 3.4 implement RFC 8693; Keycloak
is not available here.

## The identity provider (idp port), issuer `http://127.0.0.1:<idp_port>/`
- `GET /jwks`: its public keys (RS256, `kid` kN); every fetch is counted.
- `GET /control/mint?sub=S[&kid=K][&aud=A][&iss=I][&exp_in=N][&nbf_in=N][&pad=N][&forge=F]`
  -> the compact JWT as text. Defaults: the newest key, aud `bearerd`, the issuer above, exp in
  600 s. `pad` adds a claim of N characters (token size). `forge`: `bad_signature` (signature of
  another key under the same kid), `none` (`alg: none`, empty signature), `hs256` (HMAC with the
  RSA public key's PEM as secret, the classic confusion), `unknown_kid` (a key not in the set).
- `GET /control/mint_many?prefix=P&count=N[&pad=N]` -> JSON list of N tokens, subs P0..P(N-1).
- `POST /control/rotate[?drop_old=1]` -> a new key (new kid) that signs from now on; the old one
  stays in /jwks unless drop_old. Answers {"kid": ...}.
- `GET /control/stats` -> {"jwks_fetches": N, "kids": [...]}.

## The STS (sts port)
- `POST /token`: clients authenticate with client_secret_basic (RFC 6749 §2.3.1 form-encoded id
  and secret) or client_secret_post: `sidecar`/`sidecar-secret` (exchange and on-behalf-of),
  `svc`/`svc-secret` (client_credentials only). Grants:
  - `urn:ietf:params:oauth:grant-type:token-exchange` with `subject_token_type` ...:access_token
    or ...:jwt; the subject token must be a caller JWT of the IdP (signature with RS256/PS256/
    ES256/EdDSA from the IdP's keys, `iss`, `aud` containing `bearerd`, `exp`, `nbf`; leeway 5 s).
  - `urn:ietf:params:oauth:grant-type:jwt-bearer` with `requested_token_use=on_behalf_of` and the
    caller JWT as `assertion` (verified the same way).
  - `client_credentials` (the service's own token; `sub` = client id).
  Issued: a JWT signed by the STS's ES256 key: `sub` = caller's sub, `aud` = the requested
  `audience` (or `resource`, else "default"), `exp` = now + lifetime, `jti`, `act` = {"sub": client}.
  Errors: RFC 6749 §5.2 JSON (`invalid_client` 401, `invalid_grant`/`invalid_request`/
  `unsupported_grant_type` 400, `temporarily_unavailable` 503 during a forced outage).
  DPoP (RFC 9449 §5): a request with a `DPoP` header has its proof verified by dpop_common.py
  (joserfc; signature with the embedded JWK, typ, alg, htm POST, htu = this /token URL, iat
  window, unique jti, no ath; more than one header refused) before anything else: a bad proof
  is 400 `invalid_dpop_proof`. While a nonce is demanded (/control/dpop_nonce), a proof without
  the current nonce is 400 `use_dpop_nonce` with `DPoP-Nonce` (RFC 9449 §8). A token issued
  to a request with a valid proof is `token_type: DPoP` and carries `cnf.jkt` = the proof key's
  thumbprint (RFC 9449 §6.1); without a proof, `Bearer` as before.
- `GET /jwks`: the STS's public key (for the upstream).
- `GET /control/stats` -> {"requests": N, "exchanges": {sub: ok count}, "refused": {sub: n},
  "nonce_demands": N, "log": [{grant, sub, outcome, client, auth, audience, resource,
  subject_token_type, requested_token_use, scope, dpop_jkt, dpop_error, token_type}]}. Every
  /token request is logged, including refused ones; `dpop_jkt` is the verified proof key's
  thumbprint (null: no proof, or a refused one; then `dpop_error` says why).
- `POST /control/outage?on=1|0`, `POST /control/refuse?sub=S[&error=invalid_grant][&on=0]`,
  `POST /control/delay?seconds=X`, `POST /control/lifetime?seconds=N`, `POST /control/pad?bytes=N`
  (issued tokens carry a `pad` claim of N characters), `POST /control/dpop_nonce?on=1|0`
  (on: demand a new nonce from now on; off: none), `POST /control/reset` (clears counts and log).
"""
import base64
import json
import secrets
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote_plus, urlparse

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

try:  # joserfc: only DPoP requests need it (the other tests' prerequisite is PyJWT alone)
    import dpop_common
except ImportError:  # pragma: no cover
    dpop_common = None

TT_ACCESS = "urn:ietf:params:oauth:token-type:access_token"
TT_JWT = "urn:ietf:params:oauth:token-type:jwt"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
CALLER_AUDIENCE = "bearerd"
LEEWAY = 5
CLIENTS = {
    "sidecar": ("sidecar-secret", {TOKEN_EXCHANGE, JWT_BEARER}),
    "svc": ("svc-secret", {"client_credentials"}),
}


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class IdP:
    """The callers' identity provider: RSA keys by kid, the newest signs. Guarded by `lock`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.keys = {}  # kid -> private key, insertion order = age
        self.current = None
        self.jwks_fetches = 0
        self.issuer = None
        self.serial = 0
        self.rotate(False)

    def rotate(self, drop_old):
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        with self.lock:
            self.serial += 1
            kid = "k%d" % self.serial
            if drop_old:
                self.keys.clear()
            self.keys[kid] = key
            self.current = kid
        return kid

    def jwks(self):
        with self.lock:
            self.jwks_fetches += 1
            out = []
            for kid, key in self.keys.items():
                d = RSAAlgorithm.to_jwk(key.public_key(), as_dict=True)
                d.update(kid=kid, use="sig", alg="RS256")
                out.append(d)
        return {"keys": out}

    def public_keys(self):
        with self.lock:
            return {kid: key.public_key() for kid, key in self.keys.items()}

    def mint(self, sub, kid=None, aud=CALLER_AUDIENCE, iss=None, exp_in=600, nbf_in=None, pad=0, forge=None):
        now = int(time.time())
        claims = {"iss": iss or self.issuer, "sub": sub, "aud": aud, "iat": now, "exp": now + exp_in,
                  "jti": uuid.uuid4().hex}
        if nbf_in is not None:
            claims["nbf"] = now + nbf_in
        if pad:
            claims["pad"] = "p" * pad
        with self.lock:
            kid = kid or self.current
            key = self.keys.get(kid)
        if forge == "none":
            h = b64(json.dumps({"alg": "none", "typ": "JWT", "kid": kid}).encode())
            p = b64(json.dumps(claims).encode())
            return h + "." + p + "."
        if forge == "hs256":
            pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            import hmac, hashlib
            h = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
            p = b64(json.dumps(claims).encode())
            sig = hmac.new(pem, (h + "." + p).encode(), hashlib.sha256).digest()
            return h + "." + p + "." + b64(sig)
        if forge in ("bad_signature", "unknown_kid"):
            key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            if forge == "unknown_kid":
                kid = "stranger"
        if key is None:
            raise ValueError("unknown kid %r" % kid)
        return jwt.encode(claims, key, algorithm="RS256", headers={"kid": kid})

    def verify(self, token):
        """The caller's claims, or raises ValueError with the reason (strict: kid must be known)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as e:
            raise ValueError("not a JWT: %s" % e) from None
        key = self.public_keys().get(header.get("kid"))
        if key is None:
            raise ValueError("unknown kid %r" % header.get("kid"))
        try:
            return jwt.decode(token, key, algorithms=["RS256", "PS256", "ES256", "EdDSA"], audience=CALLER_AUDIENCE,
                              issuer=self.issuer, leeway=LEEWAY, options={"require": ["exp", "iss", "aud", "sub"]})
        except jwt.PyJWTError as e:
            raise ValueError("%s: %s" % (type(e).__name__, e)) from None


class STS:
    """The token service's state: its signing key, counts, the log and the forced faults. Guarded by `lock`."""

    def __init__(self, idp, delay, lifetime):
        self.idp = idp
        self.lock = threading.Lock()
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.kid = "sts-1"
        self.delay = delay
        self.lifetime = lifetime
        self.outage = False
        self.refuse = {}  # sub -> error
        self.pad = 0      # characters of a `pad` claim in issued tokens (token size)
        self.token_url = None  # this STS's /token URL: a DPoP proof's htu
        self.dpop_nonce = None  # the nonce every proof must carry, when demanded
        self.jtis = dpop_common.JtiCache() if dpop_common else None
        self.reset()

    def reset(self):
        with self.lock:
            self.requests = 0
            self.exchanges = {}
            self.refused = {}
            self.nonce_demands = 0
            self.log = []

    def jwks(self):
        d = ECAlgorithm.to_jwk(self.key.public_key(), as_dict=True)
        d.update(kid=self.kid, use="sig", alg="ES256")
        return {"keys": [d]}

    def issue(self, sub, client, audience, jkt=None):
        now = int(time.time())
        with self.lock:
            lifetime, pad = self.lifetime, self.pad
        claims = {"iss": "exchange-sts", "sub": sub, "aud": audience, "iat": now, "exp": now + lifetime,
                  "jti": uuid.uuid4().hex}
        if pad:
            claims["pad"] = "q" * pad
        if client != sub:
            claims["act"] = {"sub": client}
        if jkt:
            claims["cnf"] = {"jkt": jkt}
        token = jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})
        return {"access_token": token, "token_type": "DPoP" if jkt else "Bearer", "expires_in": lifetime}

    def check_proof(self, headers, entry):
        """The verified proof key's thumbprint (RFC 9449 §5), None without a `DPoP` header, or
        raises Refusal (400 invalid_dpop_proof, or use_dpop_nonce with the nonce)."""
        proofs = headers.get_all("DPoP") or []
        if not proofs:
            return None
        if len(proofs) > 1:
            raise Refusal(400, "invalid_dpop_proof", "more than one DPoP header")
        if dpop_common is None:
            raise Refusal(400, "invalid_dpop_proof", "this fixture has no joserfc to check proofs")
        with self.lock:
            nonce = self.dpop_nonce
        try:
            _, jkt = dpop_common.verify_proof(proofs[0], "POST", self.token_url, self.jtis, nonce=nonce)
        except dpop_common.ProofError as e:
            entry["dpop_error"] = e.description
            if e.error == "use_dpop_nonce":
                with self.lock:
                    self.nonce_demands += 1
                raise Refusal(400, "use_dpop_nonce", "Authorization server requires nonce in DPoP proof",
                              [("DPoP-Nonce", nonce)]) from None
            raise Refusal(400, "invalid_dpop_proof", e.description) from None
        entry["dpop_jkt"] = jkt
        return jkt


class Refusal(Exception):
    def __init__(self, status, error, description, headers=()):
        super().__init__(description)
        self.status, self.error, self.description, self.headers = status, error, description, list(headers)


def authenticate(headers, form):
    """(client_id, method) or raises Refusal(401 invalid_client)."""
    auth = headers.get("Authorization") or ""
    if auth.lower().startswith("basic "):
        try:
            raw = base64.b64decode(auth[6:].strip(), validate=True).decode()
            cid, secret = raw.split(":", 1)
            cid, secret, method = unquote_plus(cid), unquote_plus(secret), "client_secret_basic"
        except Exception:
            raise Refusal(401, "invalid_client", "malformed Basic credentials") from None
        if "client_secret" in form:
            raise Refusal(400, "invalid_request", "two client authentication methods")
    elif "client_secret" in form:
        cid, secret, method = form.get("client_id", ""), form["client_secret"], "client_secret_post"
    else:
        raise Refusal(401, "invalid_client", "client authentication required")
    known = CLIENTS.get(cid)
    if known is None or not secrets.compare_digest(known[0], secret):
        raise Refusal(401, "invalid_client", "unknown client or wrong secret")
    return cid, method


def token_endpoint(sts, headers, body):
    """(status, json, extra headers) for one POST /token; logs it."""
    try:
        pairs = parse_qs(body.decode(), keep_blank_values=True, strict_parsing=False)
    except Exception:
        pairs = {}
    form = {k: v[0] for k, v in pairs.items()}
    entry = {"grant": form.get("grant_type"), "sub": None, "outcome": None, "client": None, "auth": None,
             "audience": pairs.get("audience", []), "resource": pairs.get("resource", []),
             "subject_token_type": form.get("subject_token_type"),
             "requested_token_use": form.get("requested_token_use"), "scope": form.get("scope"),
             "dpop_jkt": None, "dpop_error": None, "token_type": None}
    entry["traceparent"] = headers.get("traceparent")  # W3C trace context, when bearerd traces (TracingTests)
    with sts.lock:
        sts.requests += 1
        outage, delay = sts.outage, sts.delay
    if delay:
        time.sleep(delay)
    try:
        if outage:
            raise Refusal(503, "temporarily_unavailable", "forced outage")
        for k, v in pairs.items():
            if len(v) > 1 and k not in ("audience", "resource"):
                raise Refusal(400, "invalid_request", "repeated parameter %s" % k)
        jkt = sts.check_proof(headers, entry)
        client, method = authenticate(headers, form)
        entry["client"], entry["auth"] = client, method
        grant = form.get("grant_type")
        if grant not in CLIENTS[client][1]:
            if grant in (TOKEN_EXCHANGE, JWT_BEARER, "client_credentials"):
                raise Refusal(400, "unauthorized_client", "client may not use %s" % grant)
            raise Refusal(400, "unsupported_grant_type", "grant %r" % grant)
        audience = (pairs.get("audience") or pairs.get("resource") or ["default"])
        audience = audience[0] if len(audience) == 1 else audience
        if grant == "client_credentials":
            entry["sub"] = client
            entry["outcome"] = "ok"
            reply = sts.issue(client, client, audience, jkt)
            entry["token_type"] = reply["token_type"]
            return 200, reply, []
        if grant == TOKEN_EXCHANGE:
            caller, ttype = form.get("subject_token"), form.get("subject_token_type")
            if not caller or not ttype:
                raise Refusal(400, "invalid_request", "subject_token and subject_token_type are required")
            if ttype not in (TT_ACCESS, TT_JWT):
                raise Refusal(400, "invalid_request", "unsupported subject_token_type")
            if "actor_token" in form:
                raise Refusal(400, "invalid_request", "no actor expected")
        else:
            caller = form.get("assertion")
            if not caller:
                raise Refusal(400, "invalid_request", "assertion is required")
            if form.get("requested_token_use") != "on_behalf_of":
                raise Refusal(400, "invalid_request", "requested_token_use=on_behalf_of is required")
        try:
            claims = sts.idp.verify(caller)
        except ValueError as e:
            raise Refusal(400, "invalid_grant", "caller token: %s" % e) from None
        entry["sub"] = claims["sub"]
        with sts.lock:
            forced = sts.refuse.get(claims["sub"])
        if forced:
            raise Refusal(400, forced, "refused for this test")
        reply = sts.issue(claims["sub"], client, audience, jkt)
        if grant == TOKEN_EXCHANGE:
            reply["issued_token_type"] = TT_ACCESS
        entry["outcome"] = "ok"
        entry["token_type"] = reply["token_type"]
        with sts.lock:
            sts.exchanges[claims["sub"]] = sts.exchanges.get(claims["sub"], 0) + 1
        return 200, reply, []
    except Refusal as r:
        entry["outcome"] = r.error
        if entry["sub"] is not None:
            with sts.lock:
                sts.refused[entry["sub"]] = sts.refused.get(entry["sub"], 0) + 1
        return r.status, {"error": r.error, "error_description": r.description}, r.headers
    finally:
        with sts.lock:
            sts.log.append(entry)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    role = None  # "sts" or "idp" (subclasses)
    sts = None
    idp = None

    def log_message(self, *args):
        pass

    def reply(self, status, obj, headers=()):
        body = obj.encode() if isinstance(obj, str) else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(obj, str) else "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def route(self, method):
        u = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        body = self.body()
        if self.role == "idp":
            return self.idp_route(method, u.path, q)
        return self.sts_route(method, u.path, q, body)

    def idp_route(self, method, path, q):
        idp = self.idp
        if method == "GET" and path == "/jwks":
            return self.reply(200, idp.jwks())
        if method == "GET" and path == "/control/mint":
            try:
                aud = q.get("aud", CALLER_AUDIENCE)
                token = idp.mint(q["sub"], kid=q.get("kid"), aud=aud.split(",") if "," in aud else aud,
                                 iss=q.get("iss"), exp_in=int(q.get("exp_in", 600)),
                                 nbf_in=int(q["nbf_in"]) if "nbf_in" in q else None, pad=int(q.get("pad", 0)),
                                 forge=q.get("forge"))
            except (KeyError, ValueError) as e:
                return self.reply(400, {"error": str(e)})
            return self.reply(200, token)
        if method == "GET" and path == "/control/mint_many":
            prefix, count, pad = q.get("prefix", "u"), int(q.get("count", 1)), int(q.get("pad", 0))
            return self.reply(200, [idp.mint("%s%d" % (prefix, i), pad=pad) for i in range(count)])
        if method == "POST" and path == "/control/rotate":
            return self.reply(200, {"kid": idp.rotate(q.get("drop_old") == "1")})
        if method == "GET" and path == "/control/stats":
            with idp.lock:
                return self.reply(200, {"jwks_fetches": idp.jwks_fetches, "kids": list(idp.keys), "issuer": idp.issuer})
        return self.reply(404, {"error": "not_found"})

    def sts_route(self, method, path, q, body):
        sts = self.sts
        if method == "POST" and path == "/token":
            status, obj, extra = token_endpoint(sts, self.headers, body)
            if status == 401:
                extra.append(("WWW-Authenticate", 'Basic realm="sts"'))
            if status == 503:
                extra.append(("Retry-After", "1"))
            return self.reply(status, obj, extra)
        if method == "GET" and path == "/jwks":
            return self.reply(200, sts.jwks())
        if method == "GET" and path == "/control/stats":
            with sts.lock:
                return self.reply(200, {"requests": sts.requests, "exchanges": dict(sts.exchanges),
                                        "refused": dict(sts.refused), "nonce_demands": sts.nonce_demands,
                                        "log": list(sts.log)})
        if method == "POST" and path.startswith("/control/"):
            with sts.lock:
                what = path[len("/control/"):]
                if what == "outage":
                    sts.outage = q.get("on", "1") == "1"
                elif what == "refuse":
                    if q.get("on", "1") == "1":
                        sts.refuse[q["sub"]] = q.get("error", "invalid_grant")
                    else:
                        sts.refuse.pop(q["sub"], None)
                elif what == "delay":
                    sts.delay = float(q.get("seconds", 0))
                elif what == "pad":
                    sts.pad = int(q.get("bytes", 0))
                elif what == "lifetime":
                    sts.lifetime = int(q.get("seconds", 300))
                elif what == "dpop_nonce":
                    sts.dpop_nonce = secrets.token_urlsafe(16) if q.get("on", "1") == "1" else None
                elif what != "reset":
                    return self.reply(404, {"error": "not_found"})
            if what == "reset":
                sts.reset()
            return self.reply(200, {"ok": True})
        return self.reply(404, {"error": "not_found"})

    def do_GET(self):  # noqa: N802
        self.route("GET")

    def do_POST(self):  # noqa: N802
        self.route("POST")


def serve(handler_cls):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main():
    args = sys.argv[1:]
    delay, lifetime = 0.0, 300
    while args:
        a = args.pop(0)
        if a == "--delay":
            delay = float(args.pop(0))
        elif a == "--lifetime":
            lifetime = int(args.pop(0))
        else:
            raise SystemExit("unknown argument %s" % a)
    idp = IdP()
    sts = STS(idp, delay, lifetime)
    idp_server = serve(type("IdPHandler", (Handler,), {"role": "idp", "idp": idp}))
    idp.issuer = "http://127.0.0.1:%d/" % idp_server.server_address[1]
    sts_server = serve(type("STSHandler", (Handler,), {"role": "sts", "sts": sts, "idp": idp}))
    sts.token_url = "http://127.0.0.1:%d/token" % sts_server.server_address[1]
    print("READY %d %d" % (sts_server.server_address[1], idp_server.server_address[1]), flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
