#!/usr/bin/env python3
"""An OAuth 2.0 protected resource that names its authorization server (RFC 9728), and a
recording stand-in for a foreign authorization server, for bearerd's `issuer: from_upstream`
end-to-end tests. TEST FIXTURE ONLY; standard library only; binds 127.0.0.1.

resource --as-api URL --authorization-server URL [--authorization-server URL ...]
         [--resource URL] [--no-challenge-metadata] [--base-path /p]
    The protected resource at http://127.0.0.1:PORT<base-path>.
    GET <well-known>      the RFC 9728 metadata: {"resource", "authorization_servers",
                          "bearer_methods_supported"}; `resource` is this server's URL unless
                          --resource names another. <well-known> is
                          /.well-known/oauth-protected-resource plus the base path (RFC 9728 §3.1).
    anything else         a Bearer token is checked at the authorization server (GET --as-api with
                          it: Authlib's ResourceProtector) and must have been issued for this
                          resource (RFC 8707: the `resource` the token was asked for, reported by
                          the fixture's /api/); then 200 JSON {"path", "client_id", "resource"}.
                          Otherwise 401 with `WWW-Authenticate: Bearer error="invalid_token",
                          resource_metadata="<well-known URL>"` (RFC 9728 §5.1), or without
                          resource_metadata under --no-challenge-metadata.
recorder
    Answers everything as a willing authorization server would (RFC 8414 metadata naming
    itself, tokens from /token), and records every request: a server that must hear nothing.
    POST /_test/challenge-metadata?url=URL   from now on the 401s name URL as resource_metadata
                          (the well-known document stays as it is).
Both: GET /_test/log -> JSON list of {"method", "path", "authorization"} for every other
request, in order ("authorization": the Authorization header, or null).
Prints `READY <port>`; exits when stdin closes.
"""
import argparse
import json
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WELL_KNOWN = "/.well-known/oauth-protected-resource"


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("resource")
    r.add_argument("--as-api", required=True)
    r.add_argument("--authorization-server", action="append", default=[])
    r.add_argument("--resource")
    r.add_argument("--no-challenge-metadata", action="store_true")
    r.add_argument("--base-path", default="")
    sub.add_parser("recorder")
    a = p.parse_args()

    log = []
    lock = threading.Lock()
    state = {"challenge_metadata": None}  # guarded by lock

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def reply(self, status, body, headers=()):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def handle_any(self):
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if self.path == "/_test/log":
                with lock:
                    return self.reply(200, list(log))
            if self.path.startswith("/_test/challenge-metadata?"):
                query = urllib.parse.parse_qs(self.path.split("?", 1)[1])
                with lock:
                    state["challenge_metadata"] = query.get("url", [None])[0]
                return self.reply(200, {"ok": True})
            with lock:
                log.append({"method": self.command, "path": self.path, "authorization": self.headers.get("Authorization")})
            port = self.server.server_address[1]
            me = "http://127.0.0.1:%d" % port
            if a.mode == "recorder":
                return self.recorder(me)
            return self.resource(me)

        def recorder(self, me):
            if self.path.startswith("/.well-known/"):
                return self.reply(200, {"issuer": me, "token_endpoint": me + "/token",
                                        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none"]})
            if self.path == "/token":
                return self.reply(200, {"access_token": "foreign-token", "token_type": "Bearer", "expires_in": 3600})
            return self.reply(404, {"error": "not_found"})

        def resource(self, me):
            own = me + a.base_path
            well_known = me + WELL_KNOWN + a.base_path
            if self.path == WELL_KNOWN + a.base_path:
                return self.reply(200, {"resource": a.resource or own, "authorization_servers": a.authorization_server,
                                        "bearer_methods_supported": ["header"]})
            with lock:
                named = state["challenge_metadata"] or well_known
            challenge = 'Bearer error="invalid_token"' if a.no_challenge_metadata else \
                'Bearer error="invalid_token", resource_metadata="%s"' % named
            auth = self.headers.get("Authorization") or ""
            if not auth.startswith("Bearer "):
                return self.reply(401, {"error": "invalid_token"}, [("WWW-Authenticate", challenge)])
            req = urllib.request.Request(a.as_api, headers={"Authorization": auth})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    info = json.loads(resp.read())
            except urllib.error.HTTPError:
                return self.reply(401, {"error": "invalid_token"}, [("WWW-Authenticate", challenge)])
            if own not in (info.get("resource") or []):
                # RFC 8707 §2: a token not asked for this resource is not for it.
                return self.reply(401, {"error": "invalid_token", "resource": info.get("resource")}, [("WWW-Authenticate", challenge)])
            return self.reply(200, {"path": self.path, "client_id": info.get("client_id"), "resource": info.get("resource")})

        do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = handle_any

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("READY %d" % server.server_address[1], flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
