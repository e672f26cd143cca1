#!/usr/bin/env python3
"""A real S3 (moto's server) that verifies AWS Signature V4, for the signing tests.

    python3 s3_server.py KEYS_JSON_PATH

Starts moto's threaded server on a free loopback port with authentication enforced after the
set-up calls (INITIAL_NO_AUTH_ACTION_COUNT), creates an IAM user with an access key and an
s3:* policy, and the bucket `bearerd-test`; writes {"access_key_id", "secret_access_key"} to
KEYS_JSON_PATH, prints `READY <port>`, and exits when stdin closes.
"""
import json
import os
import socket
import sys

# Four calls without authentication (user, key, policy, attachment); every later one is checked.
os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "4"

import boto3  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    keys_path = sys.argv[1]
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    iam = boto3.client("iam", endpoint_url=url, region_name="us-east-1",
                       aws_access_key_id="setup", aws_secret_access_key="setup")
    iam.create_user(UserName="bearerd")
    key = iam.create_access_key(UserName="bearerd")["AccessKey"]
    policy = iam.create_policy(PolicyName="s3-all", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
    }))["Policy"]["Arn"]
    iam.attach_user_policy(UserName="bearerd", PolicyArn=policy)
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                      aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"])
    s3.create_bucket(Bucket="bearerd-test")
    with open(keys_path, "w") as f:
        json.dump({"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}, f)
    print(f"READY {port}", flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()
