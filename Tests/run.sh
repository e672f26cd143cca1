#!/usr/bin/env bash
# The test command (README, and .ci/run calls it): installs what only the tests need, then runs
# `swift test` (module targets, then end-to-end). bearerd itself needs none of this:
#   Debian packages: python3-venv (the fixtures' venv), systemd (systemd-socket-activate and
#   systemd-analyze for the systemd and deploy/ tests), nginx (a real HTTP/2 upstream), curl (an
#   HTTP/2 client), openssl (certificates made for the tests), redis-server (the shared token cache),
#   tinyproxy (a real forward proxy for outbound_proxy)
#   PyPI, pinned, into .venv: Authlib and Flask, and Django with django-oauth-toolkit (two real
#   authorization servers), grpcio (a real gRPC server and client), websockets (a real WebSocket
#   peer), prometheus_client (the metrics parser)
# Extra arguments go to `swift test` (e.g. --filter LoginTests).
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
need=()
for pkg in python3 python3-venv systemd nginx curl redis-server tinyproxy openssl libssl-dev libnghttp2-dev pkg-config man-db groff-base; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "== installing test packages: ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# Debian's python3-authlib (1.2) is too old for the fixture; the pinned PyPI versions go into a
# project venv, which the tests find on their own (AuthServerFixture.python).
if [ ! -x .venv/bin/python3 ]; then python3 -m venv .venv; fi
.venv/bin/python3 -m pip install -q --disable-pip-version-check -r Tests/Fixtures/requirements.txt
if [ -n "${CI:-}" ]; then
    echo "== the tests' prerequisites are present (CI must not skip a test for lack of them)"
    .venv/bin/python3 -c "import authlib, flask, prometheus_client.parser, grpc, websockets, django, oauth2_provider, kubernetes_validate, hypercorn, jwt, botocore, alibabacloud_oss_v2, opentelemetry.proto"
    for tool in systemd-socket-activate systemd-analyze setpriv curl /usr/sbin/nginx /usr/bin/redis-server /usr/bin/tinyproxy; do
        command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
    done
    [ "$(id -u)" -eq 0 ] || echo "note: not root, so the SO_PEERCRED tests (run a client as another uid) will be skipped"
fi
if [ "$#" -gt 0 ]; then exec swift test "$@"; fi
# The OAuth fixture that most end-to-end suites run against is tested on its own first, over real
# HTTP (a fixture bug would otherwise show up as puzzling failures, or hide one of bearerd's).
echo "== the OAuth fixture's self-test (Tests/Fixtures/test_oauth_server.py)"
.venv/bin/python3 Tests/Fixtures/test_oauth_server.py
echo "== the signing oracle's self-test (Tests/Fixtures/test_signing_origin.py)"
.venv/bin/python3 Tests/Fixtures/test_signing_origin.py
echo "== the on-behalf-of STS and origin self-test (Tests/Fixtures/test_exchange_sts.py)"
.venv/bin/python3 Tests/Fixtures/test_exchange_sts.py
# Two runs: the module test targets on their own first, then the end-to-end tests. Swift Testing
# runs tests in parallel on a cooperative pool as wide as the machine has cores; an end-to-end
# test blocks its thread while a child process works, and on a 2-core machine two of them starve
# the unit tests' async timing (a waiter that registers within a millisecond alone took seconds
# beside them, and a gate opened late).
swift test --skip EndToEndTests
exec swift test --skip-build --filter EndToEndTests
