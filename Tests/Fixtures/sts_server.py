#!/usr/bin/env python3
"""A real AWS STS (moto's server) for the signing sessions' credential tests.

    python3 sts_server.py [--auth KEYS_JSON_PATH] [--delay SECONDS]

Serves moto's STS (AssumeRole, AssumeRoleWithWebIdentity answering the real XML) on a free
loopback port behind a thin WSGI layer that records every call (Action, the WebIdentityToken
presented, whether an Authorization field came, ExternalId) for `GET /_calls`, and can hold each
answer for --delay seconds (so concurrent callers overlap).

--auth enforces moto's SigV4 verification after the set-up calls: an IAM user `bearerd` with an
access key and a policy allowing sts:AssumeRole is created and its keys written to KEYS_JSON_PATH
as {"access_key_id", "secret_access_key"}. (moto then also wants AssumeRoleWithWebIdentity
signed, which real STS does not: web identity tests run without --auth.)

Prints `READY <port>` and exits when stdin closes.
"""
import io
import json
import os
import socket
import sys
import threading
import time
from urllib.parse import parse_qs

args = sys.argv[1:]
keys_path = None
delay = 0.0
while args:
    a = args.pop(0)
    if a == "--auth":
        keys_path = args.pop(0)
    elif a == "--delay":
        delay = float(args.pop(0))
    else:
        raise SystemExit(f"unknown argument {a}")

# Four calls without authentication (user, key, policy, attachment); every later one is checked.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4" if keys_path else "1000000000"

import boto3  # noqa: E402
from werkzeug.serving import make_server  # noqa: E402
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app  # noqa: E402

calls = []
lock = threading.Lock()


class Recorder:
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == "/_calls":
            with lock:
                body = json.dumps(calls).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        form = {k: v[0] for k, v in parse_qs(raw.decode(), keep_blank_values=True).items()}
        if form.get("Action"):
            with lock:
                calls.append({
                    "action": form.get("Action"),
                    "web_identity_token": form.get("WebIdentityToken"),
                    "role_arn": form.get("RoleArn"),
                    "session_name": form.get("RoleSessionName"),
                    "external_id": form.get("ExternalId"),
                    "duration": form.get("DurationSeconds"),
                    "authorization": bool(environ.get("HTTP_AUTHORIZATION")),
                    "signed_with": (environ.get("HTTP_AUTHORIZATION") or "").split("Credential=")[-1].split("/")[0] or None,
                })
            if delay:
                time.sleep(delay)
        environ["wsgi.input"] = io.BytesIO(raw)
        environ["CONTENT_LENGTH"] = str(len(raw))
        return self.app(environ, start_response)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    port = free_port()
    app = Recorder(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", port, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    if keys_path:
        iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                           aws_access_key_id="setup", aws_secret_access_key="setup")
        iam.create_user(UserName="bearerd")
        key = iam.create_access_key(UserName="bearerd")["AccessKey"]
        policy = iam.create_policy(PolicyName="assume", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "sts:AssumeRole", "Resource": "*"}],
        }))["Policy"]["Arn"]
        iam.attach_user_policy(UserName="bearerd", PolicyArn=policy)
        with open(keys_path, "w") as f:
            json.dump({"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}, f)
        with lock:
            calls.clear()
    print(f"READY {port}", flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
