#!/usr/bin/env python3
"""A DPoP-checking resource server (RFC 9449 §7, §9) for bearerd's end-to-end tests, HTTP/1.1,
or with --h2c HTTP/2 over cleartext (prior knowledge, RFC 9113 §3.3; Hypercorn, which also still
answers HTTP/1.1 on the same port). TEST FIXTURE ONLY.

    python3 dpop_origin.py --port 0 [--h2c] [--clock-skew N]
                                    prints `READY <port>`; exits when stdin closes. --clock-skew: proofs'
                                    iat is checked against the host's clock plus N seconds

Every request other than /_test/* must carry `Authorization: DPoP <token>` (a token from
oauth_server.py's DPoP token endpoint: a JWT with cnf.jkt, see dpop_common.py) and a `DPoP` proof
whose signature verifies with its embedded JWK, with typ dpop+jwt, htm = the method, htu =
http://<Host><path> (no query), iat in the window, a jti never seen before, ath = the token's hash,
its key's thumbprint = the token's cnf.jkt, and the current nonce: a proof without it (first
contact included) gets 401 `WWW-Authenticate: DPoP error="use_dpop_nonce"` with `DPoP-Nonce`.
Other failures: 401 `WWW-Authenticate: DPoP error="invalid_token"` (bad token) or
error="invalid_dpop_proof". Success: 200 JSON {"method", "path", "jkt", "body_length"}.

Test hooks: POST /_test/rotate-nonce (a new nonce; later proofs with the old one are refused),
GET /_test/stats {"ok", "nonce_demands", "failures": [...], "accepted": [{"http_version", "jti",
"path", "peer"}...]} (`accepted`: one entry per request that passed, `peer` the client's address:port,
i.e. which upstream connection carried it).
"""
import argparse
import json
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dpop_common


class State:
    lock = threading.Lock()
    nonce = secrets.token_urlsafe(16)
    jtis = dpop_common.JtiCache()
    ok = 0
    nonce_demands = 0
    failures = []
    accepted = []
    clock_skew = 0  # --clock-skew: this server's clock runs that many seconds off the host's


def decide(method, path, host, authorization, proof, http_version, peer):
    """The origin's verdict on one request, whatever the HTTP version: (status, body, headers)."""
    if not authorization.startswith("DPoP "):
        return refusal("invalid_token", "Authorization is not DPoP: %r" % authorization.split(" ")[0])
    token = authorization[len("DPoP "):]
    bound = dpop_common.token_binding(token)
    if bound is None:
        return refusal("invalid_token", "not a bound token of the fixture")
    with State.lock:
        nonce = State.nonce
    htu = "http://%s%s" % (host, path)
    try:
        claims, jkt = dpop_common.verify_proof(proof, method, htu, State.jtis, access_token=token, nonce=nonce,
                                               now=time.time() + State.clock_skew)
    except dpop_common.ProofError as e:
        if e.error == "use_dpop_nonce":
            with State.lock:
                State.nonce_demands += 1
            return 401, {"error": "use_dpop_nonce"}, [
                ("WWW-Authenticate", 'DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof"'),
                ("DPoP-Nonce", nonce)]
        return refusal("invalid_dpop_proof", e.description)
    if jkt != bound:
        return refusal("invalid_token", "the proof's key is not the token's cnf.jkt")
    with State.lock:
        State.ok += 1
        State.accepted.append({"http_version": http_version, "jti": claims.get("jti"), "path": path, "peer": peer})
    return 200, {"method": method, "path": path, "jkt": jkt, "http_version": http_version}, []


def refusal(error, description):
    with State.lock:
        State.failures.append(description)
    return 401, {"error": error, "detail": description}, [("WWW-Authenticate", 'DPoP error="%s", algs="ES256 RS256 PS256"' % error)]


def test_hook(path):
    """(status, body) for /_test/* paths, else None."""
    if path == "/_test/rotate-nonce":
        with State.lock:
            State.nonce = secrets.token_urlsafe(16)
            return 200, {"nonce": State.nonce}
    if path == "/_test/stats":
        with State.lock:
            return 200, {"ok": State.ok, "nonce_demands": State.nonce_demands, "failures": list(State.failures),
                         "accepted": list(State.accepted)}
    return None


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
        body = self._body()
        hook = test_hook(path)
        if hook is not None:
            return self._send(hook[0], hook[1])
        status, answer, headers = decide(self.command, path, self.headers.get("Host"), self.headers.get("Authorization") or "",
                                         self.headers.get("DPoP"), "1.1", "%s:%d" % self.client_address[:2])
        if status == 200:
            answer["body_length"] = len(body)
        self._send(status, answer, headers)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


async def asgi_app(scope, receive, send):
    """The same checks as `Handler`, as an ASGI application (per HTTP/2 stream under Hypercorn)."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    length = 0
    while True:
        message = await receive()
        length += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    path = scope["path"]
    hook = test_hook(path)
    if hook is not None:
        status, answer, extra = hook[0], hook[1], []
    else:
        client = scope.get("client") or ("?", 0)
        status, answer, extra = decide(scope["method"], path, headers.get("host"), headers.get("authorization") or "",
                                       headers.get("dpop"), scope.get("http_version", "?"), "%s:%d" % (client[0], client[1]))
        if status == 200:
            answer["body_length"] = length
    data = json.dumps(answer).encode()
    out = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    out += [(k.lower().encode(), v.encode()) for k, v in extra]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": data if scope["method"] != "HEAD" else b""})


def serve_h2c(port):
    """Hypercorn on a socket bound here (to learn the port before READY); stops when stdin closes."""
    import asyncio
    import socket

    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HypercornConfig

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(256)
    sock.set_inheritable(True)
    config = HypercornConfig()
    config.bind = ["fd://%d" % sock.fileno()]
    config.accesslog = None
    config.errorlog = None
    config.h2_max_concurrent_streams = 100

    async def run():
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def wait_stdin():
            sys.stdin.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_stdin, daemon=True).start()
        print("READY %d" % sock.getsockname()[1], flush=True)
        await serve(asgi_app, config, shutdown_trigger=stop.wait)

    asyncio.run(run())
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--h2c", action="store_true", help="HTTP/2 with prior knowledge (and HTTP/1.1) via Hypercorn")
    p.add_argument("--clock-skew", type=int, default=0, help="check proofs' iat against the host's clock plus this")
    args = p.parse_args()
    State.clock_skew = args.clock_skew
    if args.h2c:
        return serve_h2c(args.port)
    ThreadingHTTPServer.request_queue_size = 256
    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print("READY %d" % srv.server_port, flush=True)
    sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
