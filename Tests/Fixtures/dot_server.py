#!/usr/bin/env python3
"""A second real OAuth 2.0 / OpenID Connect authorization server for bearerd's end-to-end tests:
django-oauth-toolkit (DOT) in a single-file Django project. TEST FIXTURE ONLY.

Run:
    python3 dot_server.py --state-dir DIR [--token-lifetime 3600] [--root-metadata] [--rfc9700]

Prints `READY <port>` on stdout once it listens on 127.0.0.1 (ephemeral port) and exits when its
stdin closes (the `PythonFixture` protocol). DIR holds the sqlite database; `migrate` runs at
start. Binds 127.0.0.1 only.

DOT is mounted as most Django deployments mount it, under `/o/`, every endpoint WITH a trailing
slash (Django answers 404 without it; no CommonMiddleware, so no APPEND_SLASH redirect):

    GET  /o/authorize/                      authorization code (PKCE required), OIDC
    POST /o/token/                          authorization_code, refresh_token (rotated), device_code
    POST /o/revoke_token/                   RFC 7009
    POST /o/device-authorization/           RFC 8628 §3.1
    GET  /o/.well-known/openid-configuration  OIDC discovery; issuer http://127.0.0.1:<port>/o
    /.well-known/oauth-authorization-server/o  RFC 8414 metadata, only with --root-metadata (DOT's
                                            docs tell prefixed deployments to mount it at the root)

OIDC is on (RS256 key made at start): scope `openid` returns an id_token carrying the nonce.
Access tokens live --token-lifetime seconds; refresh tokens rotate (ROTATE_REFRESH_TOKEN) with no
grace period, so a replayed old refresh token is `invalid_grant`.

Applications (all public, skip_authorization: no consent page):

    client_id  grant                  redirect URIs
    ---------  ---------------------  -----------------------------------------------------------
    native     authorization-code     http://127.0.0.1/callback (RFC 8252 §7.3: DOT lets any port
                                      through for 127.0.0.1 and ::1, the path must match)
    tv         device_code            -

    More via POST /_test/app/.

Users: alice and bob. Every request without a session is signed in as alice (test middleware), so
a "browser" that just follows redirects completes the authorization.

Protected API (the upstream for bearerd's routes):
    ANY /api/<path>     DOT ProtectedResourceMetadataView: 200 JSON {"user", "client_id", "scope",
                        "path", "method"}; a bad token gets 401 with `WWW-Authenticate: Bearer
                        error="invalid_token", ...` (RFC 6750 §3.1).
    ANY /legacy/<path>  DOT's plain ProtectedResourceView: same, but a bad token gets a bare 403
                        without WWW-Authenticate (DOT's historical default).

Test hooks (not OAuth):
    POST /_test/app/             JSON {"client_id", "grant": "authorization-code"|"device",
                                 "redirect_uris": "space separated"}: another public application
    POST /_test/device/approve/  JSON {"user_code", "user": "alice", "approve": true}: what the
                                 verification page does once a person entered the code
    POST /_test/expire-all/      every access token expires now (the API answers 401 invalid_token);
                                 refresh tokens stay valid. (RFC 7009 revocation of an access token
                                 revokes its refresh token too in DOT, and a refresh token whose
                                 access token was deleted is refused.)
    GET  /_test/stats/           JSON {"token_requests": {grant_type: n}, "token_errors":
                                 {error: n}, "not_found": [paths], "api": {status: n},
                                 "refresh_tokens": {"live": n, "revoked": n}}
"""

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import timedelta

import django
from django.conf import settings


def configure(state_dir, token_lifetime, root_metadata, rfc9700):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    settings.configure(
        DEBUG=False,
        SECRET_KEY="bearerd-test-fixture-only",
        ALLOWED_HOSTS=["127.0.0.1", "localhost", "[::1]"],
        ROOT_URLCONF=__name__,
        USE_TZ=True,
        INSTALLED_APPS=[
            "django.contrib.auth",
            "django.contrib.contenttypes",
            "django.contrib.sessions",
            "oauth2_provider",
        ],
        MIDDLEWARE=[
            "django.contrib.sessions.middleware.SessionMiddleware",
            "django.contrib.auth.middleware.AuthenticationMiddleware",
            __name__ + ".AutoLoginMiddleware",
            __name__ + ".StatsMiddleware",
        ],
        DATABASES={
            "default": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": os.path.join(state_dir, "dot.sqlite3"),
                # Test data only: no fsync (migrate alone commits ~100 times; on a busy disk that
                # took tens of seconds), WAL so the API's reads do not wait for token writes.
                "OPTIONS": {"timeout": 20, "init_command": "PRAGMA synchronous=OFF; PRAGMA journal_mode=WAL;"},
            }
        },
        # Tables straight from the models (`migrate --run-syncdb`): rendering every migration's
        # state took most of the start-up time; the schema is the same for a fresh database.
        MIGRATION_MODULES={app: None for app in ("auth", "contenttypes", "sessions", "oauth2_provider")},
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True}],
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        LOGGING_CONFIG=None,
        OAUTH2_PROVIDER={
            "OIDC_ENABLED": True,
            "OIDC_RSA_PRIVATE_KEY": pem,
            "PKCE_REQUIRED": True,
            "ROTATE_REFRESH_TOKEN": True,
            "ACCESS_TOKEN_EXPIRE_SECONDS": token_lifetime,
            "DEVICE_FLOW_INTERVAL": 1,
            "SCOPES": {"openid": "OpenID Connect", "read": "Reading scope", "write": "Writing scope"},
            "DEFAULT_SCOPES": ["read"],
            # Filled in once the port is known (main).
            "OAUTH_DEVICE_VERIFICATION_URI": None,
            # --rfc9700: every RFC 9700 gate on (DOT 4.0's announced defaults): `iss` in the
            # authorization response (RFC 9207), S256 only, tokens hashed at rest, no implicit or
            # password grant, no token in the query.
            **({name: True for name in RFC9700_GATES} if rfc9700 else {}),
        },
    )
    global ROOT_METADATA
    ROOT_METADATA = root_metadata
    django.setup()


ROOT_METADATA = False
RFC9700_GATES = (
    "COMPLIANT_BCP_RFC9700_IMPLICIT_GRANT",
    "COMPLIANT_BCP_RFC9700_PASSWORD_GRANT",
    "COMPLIANT_BCP_RFC9700_PKCE_METHOD",
    "COMPLIANT_BCP_RFC9700_ACCESS_TOKEN_TRANSPORT",
    "COMPLIANT_BCP_RFC9700_AUTHZ_RESPONSE_ISS",
    "COMPLIANT_BCP_RFC9700_TOKEN_STORAGE",
)
STATS_LOCK = threading.Lock()
STATS = {"token_requests": Counter(), "token_errors": Counter(), "not_found": [], "api": Counter()}


class AutoLoginMiddleware:
    """Test only: every request without a signed-in user acts as alice."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.contrib.auth.models import User

        if not request.user.is_authenticated:
            request.user = User.objects.get(username="alice")
        return self.get_response(request)


class StatsMiddleware:
    """Counts token requests by grant type and error, 404s by path, API answers by status."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        grant = request.POST.get("grant_type", "") if request.path == "/o/token/" else None
        response = self.get_response(request)
        with STATS_LOCK:
            if grant is not None:
                STATS["token_requests"][grant] += 1
                if response.status_code != 200:
                    try:
                        STATS["token_errors"][json.loads(response.content).get("error", "?")] += 1
                    except ValueError:
                        STATS["token_errors"]["?"] += 1
            if response.status_code == 404:
                STATS["not_found"].append(request.path)
            if request.path.startswith("/api/") or request.path.startswith("/legacy/"):
                STATS["api"][str(response.status_code)] += 1
        return response


def api_views():
    from django.http import JsonResponse
    from oauth2_provider.views.generic import ProtectedResourceMetadataView, ProtectedResourceView

    def answer(request, rest):
        token = getattr(getattr(request, "oauth", None), "access_token", None)
        return JsonResponse(
            {
                "user": request.resource_owner.username if request.resource_owner else None,
                "client_id": token.application.client_id if token else None,
                "scope": token.scope if token else None,
                "path": request.path,
                "method": request.method,
            }
        )

    class Keep:
        """Keeps the oauthlib request (it holds the AccessToken) for `answer`."""

        def verify_request(self, request):
            valid, r = super().verify_request(request)
            request.oauth = r
            return valid, r

    class Api(Keep, ProtectedResourceMetadataView):
        def get(self, request, rest=""):
            return answer(request, rest)

        post = put = delete = get

    class Legacy(Keep, ProtectedResourceView):
        def get(self, request, rest=""):
            return answer(request, rest)

        post = put = delete = get

    return Api.as_view(), Legacy.as_view()


def test_views():
    from django.contrib.auth.models import User
    from django.http import JsonResponse
    from django.utils import timezone
    from django.views.decorators.csrf import csrf_exempt
    from oauth2_provider.models import get_access_token_model, get_device_grant_model, get_refresh_token_model

    @csrf_exempt
    def app(request):
        body = json.loads(request.body)
        grant = body.get("grant", "authorization-code")
        make_app(body["client_id"], grant, body.get("redirect_uris", ""))
        return JsonResponse({"ok": True})

    @csrf_exempt
    def approve(request):
        body = json.loads(request.body)
        grants = get_device_grant_model().objects
        try:
            g = grants.get(user_code=body["user_code"])
        except grants.model.DoesNotExist:
            return JsonResponse({"error": "no such user code"}, status=404)
        g.user = User.objects.get(username=body.get("user", "alice"))
        g.status = g.AUTHORIZED if body.get("approve", True) else g.DENIED
        g.save()
        return JsonResponse({"ok": True})

    @csrf_exempt
    def expire_all(request):
        # Expired, not deleted: DOT refuses a refresh token whose access token is gone.
        n = get_access_token_model().objects.update(expires=timezone.now() - timedelta(seconds=1))
        return JsonResponse({"expired": n})

    def stats(request):
        refresh = get_refresh_token_model().objects
        with STATS_LOCK:
            return JsonResponse(
                {
                    "token_requests": dict(STATS["token_requests"]),
                    "token_errors": dict(STATS["token_errors"]),
                    "not_found": list(STATS["not_found"]),
                    "api": dict(STATS["api"]),
                    "refresh_tokens": {
                        "live": refresh.filter(revoked__isnull=True).count(),
                        "revoked": refresh.filter(revoked__isnull=False).count(),
                    },
                }
            )

    return app, approve, expire_all, stats


def make_app(client_id, grant, redirect_uris=""):
    from oauth2_provider.models import get_application_model

    Application = get_application_model()
    grant_type = Application.GRANT_DEVICE_CODE if grant == "device" else Application.GRANT_AUTHORIZATION_CODE
    Application.objects.update_or_create(
        client_id=client_id,
        defaults={
            "name": client_id,
            "client_type": Application.CLIENT_PUBLIC,
            "authorization_grant_type": grant_type,
            "redirect_uris": redirect_uris,
            "skip_authorization": True,
            "algorithm": Application.RS256_ALGORITHM,
            "client_secret": "",
        },
    )


def build_urlpatterns():
    from django.urls import include, path, re_path
    from oauth2_provider import urls as dot_urls

    api, legacy = api_views()
    app, approve, expire_all, stats = test_views()
    patterns = [
        path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
        re_path(r"^api/(?P<rest>.*)$", api),
        re_path(r"^legacy/(?P<rest>.*)$", legacy),
        path("_test/app/", app),
        path("_test/device/approve/", approve),
        path("_test/expire-all/", expire_all),
        path("_test/stats/", stats),
    ]
    if ROOT_METADATA:
        patterns.append(path("", include((dot_urls.metadata_urlpatterns, "dot_root"))))
    return patterns


urlpatterns = []


def main():
    p = argparse.ArgumentParser(description="OAuth 2.0 test authorization server (django-oauth-toolkit)")
    p.add_argument("--state-dir", default=None, help="directory for the sqlite database (default: a temporary one)")
    p.add_argument("--token-lifetime", type=int, default=3600)
    p.add_argument("--root-metadata", action="store_true")
    p.add_argument("--rfc9700", action="store_true")
    args = p.parse_args()
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="bearerd-dot-")

    t0 = time.monotonic()
    configure(state_dir, args.token_lifetime, args.root_metadata, args.rfc9700)
    t1 = time.monotonic()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
    from django.core.wsgi import get_wsgi_application
    from oauth2_provider.settings import oauth2_settings

    call_command("migrate", run_syncdb=True, verbosity=0, interactive=False)
    t2 = time.monotonic()
    for name in ("alice", "bob"):
        User.objects.get_or_create(username=name)
    make_app("native", "authorization-code", "http://127.0.0.1/callback")
    make_app("tv", "device")
    global urlpatterns
    urlpatterns = build_urlpatterns()

    httpd = ThreadedWSGIServer(("127.0.0.1", 0), WSGIRequestHandler, ipv6=False)
    httpd.set_app(get_wsgi_application())
    port = httpd.server_address[1]
    settings.OAUTH2_PROVIDER["OAUTH_DEVICE_VERIFICATION_URI"] = "http://127.0.0.1:%d/o/device/" % port
    oauth2_settings.reload()

    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print("READY %d" % port, flush=True)
    print("dot_server: listening on 127.0.0.1:%d (setup %.1f s, migrate %.1f s, total %.1f s)"
          % (port, t1 - t0, t2 - t1, time.monotonic() - t0), file=sys.stderr, flush=True)
    sys.stdin.read()  # exits when the test closes our stdin (or dies)
    httpd.shutdown()


if __name__ == "__main__":
    main()
