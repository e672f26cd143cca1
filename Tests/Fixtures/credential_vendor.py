#!/usr/bin/env python3
"""Credential vending endpoints and an Alibaba Cloud STS for the signing sessions' tests.

    python3 credential_vendor.py [--token-file PATH] [--header NAME=VALUE] [--oidc-token-file PATH] [--delay S]

On a free loopback port:
- GET /container: the container-credentials JSON (AccessKeyId, SecretAccessKey, Token, Expiration)
  as the ECS/EKS Pod Identity agents answer; GET /seed004: seed 004's distribute-token.json shape
  (accessKeyId, accessKeySecret, securityToken, expiration). Both check the request: with
  --token-file its content (re-read per request) must be the Authorization field, with --header
  that field must be present with that value; else 401 {"code": ..., "message": ...}.
- POST /aliyun-sts: Alibaba Cloud STS AssumeRoleWithOIDC, checked as Alibaba documents the call
  (API reference "AssumeRoleWithOIDC", RPC style, anonymous): the RPC common parameters
  Action=AssumeRoleWithOIDC, Format=JSON, Version=2015-04-01 and Timestamp (ISO 8601 UTC,
  yyyy-MM-ddTHH:mm:ssZ, within 15 minutes) in the query; the operation's parameters in the
  form body: RoleArn, OIDCProviderArn, OIDCToken (with --oidc-token-file: exactly its content),
  RoleSessionName, and optionally DurationSeconds (>= 900); nothing else anywhere (no AccessKeyId,
  Signature*, no Authorization field). Anything off is a 400 in Alibaba's error shape
  {"RequestId", "HostId", "Code", "Message", "Recommend"}.
- POST /_fail {"path", "status", "body", "count"}: the next `count` requests to `path` get that
  answer instead (scripted STS and vendor errors).
- GET /_calls: every credential request seen (path, method, authorization, query, form).

Every successful answer carries fresh keys (a counter in the key id) expiring in an hour
(--expires-in S to change). Prints `READY <port>`; exits when stdin closes.
"""
import datetime
import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

args = sys.argv[1:]
token_file = None
oidc_token_file = None
required_headers = {}
delay = 0.0
expires_in = 3600
while args:
    a = args.pop(0)
    if a == "--token-file":
        token_file = args.pop(0)
    elif a == "--oidc-token-file":
        oidc_token_file = args.pop(0)
    elif a == "--header":
        name, _, value = args.pop(0).partition("=")
        required_headers[name] = value
    elif a == "--delay":
        delay = float(args.pop(0))
    elif a == "--expires-in":
        expires_in = int(args.pop(0))
    else:
        raise SystemExit(f"unknown argument {a}")

lock = threading.Lock()
calls = []
failures = {}
counter = [0]


def iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def fresh_keys():
    with lock:
        counter[0] += 1
        n = counter[0]
    expiration = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=expires_in)
    return f"ASIAVENDOR{n:06d}", f"secret/{n}+Key=", f"session-token-{n}", iso(expiration)


def alibaba_error(code, message):
    return 400, {"RequestId": "6894B13B-6D71-4EF5-88FA-F32781734A7F", "HostId": "sts.aliyuncs.com",
                 "Code": code, "Message": message, "Recommend": "https://api.aliyun.com/troubleshoot"}


def check_aliyun(method, query, form, headers):
    if method != "POST":
        return alibaba_error("InvalidParameter", "this test STS expects POST")
    if headers.get("Authorization"):
        return alibaba_error("InvalidParameter", "AssumeRoleWithOIDC is anonymous: no Authorization")
    ctype = headers.get("Content-Type", "")
    if not ctype.startswith("application/x-www-form-urlencoded"):
        return alibaba_error("InvalidParameter", f"Content-Type {ctype}")
    want_query = {"Action", "Format", "Version", "Timestamp"}
    if set(query) != want_query:
        return alibaba_error("MissingParameter" if want_query - set(query) else "InvalidParameter",
                             f"query parameters {sorted(query)}, expected {sorted(want_query)}")
    if query["Action"] != "AssumeRoleWithOIDC" or query["Format"] != "JSON" or query["Version"] != "2015-04-01":
        return alibaba_error("InvalidParameter", f"common parameters {query}")
    if not re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", query["Timestamp"]):
        return alibaba_error("InvalidTimeStamp.Format", f"Timestamp {query['Timestamp']}")
    stamp = datetime.datetime.strptime(query["Timestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    if abs((datetime.datetime.now(datetime.timezone.utc) - stamp).total_seconds()) > 900:
        return alibaba_error("InvalidTimeStamp.Expired", f"Timestamp {query['Timestamp']}")
    required = {"RoleArn", "OIDCProviderArn", "OIDCToken", "RoleSessionName"}
    missing = required - set(form)
    if missing:
        return alibaba_error("MissingParameter", f"missing {sorted(missing)}")
    extra = set(form) - required - {"DurationSeconds"}
    if extra:
        return alibaba_error("InvalidParameter", f"unexpected parameters {sorted(extra)}")
    if not form["RoleArn"].startswith("acs:ram::") or ":role/" not in form["RoleArn"]:
        return alibaba_error("InvalidParameter.RoleArn", "RoleArn")
    if not form["OIDCProviderArn"].startswith("acs:ram::") or ":oidc-provider/" not in form["OIDCProviderArn"]:
        return alibaba_error("InvalidParameter.OIDCProviderArn", "OIDCProviderArn")
    if not re.fullmatch(r"[A-Za-z0-9.@_-]{2,64}", form["RoleSessionName"]):
        return alibaba_error("InvalidParameter.RoleSessionName", "RoleSessionName")
    if "DurationSeconds" in form and (not form["DurationSeconds"].isdigit() or int(form["DurationSeconds"]) < 900):
        return alibaba_error("InvalidParameter.DurationSeconds", "DurationSeconds")
    if oidc_token_file is not None:
        with open(oidc_token_file) as f:
            expected = f.read().strip()
        if form["OIDCToken"] != expected:
            return alibaba_error("AuthenticationFail.OIDCToken.Invalid", "the OIDC token is not the one projected")
    key, secret, token, expiration = fresh_keys()
    return 200, {"RequestId": "3D57EAD2-8723-1F26-B69C-F8707D8B565D",
                 "OIDCTokenInfo": {"Subject": "system:serviceaccount:default:app", "Issuer": "https://oidc.example", "ClientIds": "sts.aliyuncs.com"},
                 "AssumedRoleUser": {"AssumedRoleId": "33157794895460****:" + form["RoleSessionName"],
                                     "Arn": form["RoleArn"].replace(":role/", ":assumed-role/") + "/" + form["RoleSessionName"]},
                 "Credentials": {"SecurityToken": token, "Expiration": expiration, "AccessKeySecret": secret, "AccessKeyId": key}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def reply(self, status, obj):
        body = json.dumps(obj).encode() if not isinstance(obj, (bytes, str)) else (obj.encode() if isinstance(obj, str) else obj)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def handle_any(self, method):
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if parts.path == "/_calls":
            with lock:
                return self.reply(200, calls)
        if parts.path == "/_fail":
            spec = json.loads(raw)
            with lock:
                failures[spec["path"]] = [spec["status"], spec["body"], spec.get("count", 1)]
            return self.reply(200, {})
        query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        form = {k: v[0] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}
        with lock:
            calls.append({"path": parts.path, "method": method, "authorization": self.headers.get("Authorization"),
                          "headers": {k: v for k, v in self.headers.items()}, "query": query, "form": form})
            scripted = failures.get(parts.path)
            if scripted:
                scripted[2] -= 1
                if scripted[2] <= 0:
                    del failures[parts.path]
        if delay:
            time.sleep(delay)
        if scripted:
            return self.reply(scripted[0], scripted[1])
        if parts.path in ("/container", "/seed004"):
            if method != "GET":
                return self.reply(405, {"code": "MethodNotAllowed", "message": method})
            if token_file is not None:
                with open(token_file) as f:
                    expected = f.read().strip()
                if self.headers.get("Authorization") != expected:
                    return self.reply(401, {"code": "Unauthorized", "message": "wrong or missing Authorization"})
            for name, value in required_headers.items():
                if self.headers.get(name) != value:
                    return self.reply(401, {"code": "Unauthorized", "message": f"missing {name}"})
            key, secret, token, expiration = fresh_keys()
            if parts.path == "/container":
                return self.reply(200, {"RoleArn": "arn:aws:iam::123456789012:role/app", "AccessKeyId": key,
                                        "SecretAccessKey": secret, "Token": token, "Expiration": expiration})
            return self.reply(200, {"accessKeyId": key, "accessKeySecret": secret, "securityToken": token,
                                    "expiration": expiration})
        if parts.path == "/aliyun-sts":
            status, obj = check_aliyun(method, query, form, self.headers)
            return self.reply(status, obj)
        self.reply(404, {"code": "NotFound", "message": parts.path})

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"READY {server.server_address[1]}", flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
