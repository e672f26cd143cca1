#!/usr/bin/env python3
"""A DPoP-checking resource server (RFC 9449 §7, §9) for bearerd's end-to-end tests, HTTP/1.1.
TEST FIXTURE ONLY.

    python3 dpop_origin.py --port 0      prints `READY <port>`; exits when stdin closes

Every request other than /_test/* must carry `Authorization: DPoP <token>` (a token from
oauth_server.py's DPoP token endpoint: a JWT with cnf.jkt, see dpop_common.py) and a `DPoP` proof
whose signature verifies with its embedded JWK, with typ dpop+jwt, htm = the method, htu =
http://<Host><path> (no query), iat in the window, a jti never seen before, ath = the token's hash,
its key's thumbprint = the token's cnf.jkt, and the current nonce: a proof without it (first
contact included) gets 401 `WWW-Authenticate: DPoP error="use_dpop_nonce"` with `DPoP-Nonce`.
Other failures: 401 `WWW-Authenticate: DPoP error="invalid_token"` (bad token) or
error="invalid_dpop_proof". Success: 200 JSON {"method", "path", "jkt", "body_length"}.

Test hooks: POST /_test/rotate-nonce (a new nonce; later proofs with the old one are refused),
GET /_test/stats {"ok", "nonce_demands", "failures": [...]}.
"""
import argparse
import json
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dpop_common


class State:
    lock = threading.Lock()
    nonce = secrets.token_urlsafe(16)
    jtis = dpop_common.JtiCache()
    ok = 0
    nonce_demands = 0
    failures = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _send(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _handle(self):
        path = self.path.split("?", 1)[0]
        if path == "/_test/rotate-nonce":
            self._body()
            with State.lock:
                State.nonce = secrets.token_urlsafe(16)
            return self._send(200, {"nonce": State.nonce})
        if path == "/_test/stats":
            with State.lock:
                return self._send(200, {"ok": State.ok, "nonce_demands": State.nonce_demands, "failures": list(State.failures)})
        body = self._body()
        auth = self.headers.get("Authorization") or ""
        if not auth.startswith("DPoP "):
            return self._refuse("invalid_token", "Authorization is not DPoP: %r" % auth.split(" ")[0])
        token = auth[len("DPoP "):]
        bound = dpop_common.token_binding(token)
        if bound is None:
            return self._refuse("invalid_token", "not a bound token of the fixture")
        with State.lock:
            nonce = State.nonce
        htu = "http://%s%s" % (self.headers.get("Host"), path)
        try:
            _, jkt = dpop_common.verify_proof(self.headers.get("DPoP"), self.command, htu, State.jtis,
                                              access_token=token, nonce=nonce)
        except dpop_common.ProofError as e:
            if e.error == "use_dpop_nonce":
                with State.lock:
                    State.nonce_demands += 1
                return self._send(401, {"error": "use_dpop_nonce"},
                                  [("WWW-Authenticate", 'DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof"'),
                                   ("DPoP-Nonce", nonce)])
            return self._refuse("invalid_dpop_proof", e.description)
        if jkt != bound:
            return self._refuse("invalid_token", "the proof's key is not the token's cnf.jkt")
        with State.lock:
            State.ok += 1
        self._send(200, {"method": self.command, "path": path, "jkt": jkt, "body_length": len(body)})

    def _refuse(self, error, description):
        with State.lock:
            State.failures.append(description)
        self._send(401, {"error": error, "detail": description},
                   [("WWW-Authenticate", 'DPoP error="%s", algs="ES256 RS256 PS256"' % error)])

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    ThreadingHTTPServer.request_queue_size = 256
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("READY %d" % srv.server_port, flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
