#!/usr/bin/env python3
"""A real OAuth 2.0 authorization server (plus a protected test API) for bearerd's
end-to-end tests, built on Authlib's Flask integration. TEST FIXTURE ONLY.

Run:
    python3 oauth_server.py --port 0 --port-file /tmp/as.port [--token-lifetime 3600]
        [--rotate-refresh-tokens] [--grace-seconds 10] [--trailing-slash] [--verbose]

Binds 127.0.0.1 only. All state is in memory and lost on exit.

Fixed clients (RFC 6749 §2.3.1 client authentication):

    client_id   secret          token_endpoint_auth_method  grants
    ---------   -------------   --------------------------  -------------------------------------
    svc         svc-secret      client_secret_basic         client_credentials
    svc-post    post-secret     client_secret_post          client_credentials
    app         app-secret      client_secret_basic         password, refresh_token
    cli         (none)          none (public client)        password, refresh_token
    we:ird      p@ss w+rd/:     client_secret_basic         client_credentials

    `we:ird` tests the rule of RFC 6749 §2.3.1 that client_id and secret are each
    form-urlencoded (application/x-www-form-urlencoded, space as `+`) BEFORE being joined
    with `:` and base64-encoded. A client that skips the encoding fails: the raw `:` in the
    id splits it wrongly, and a raw `+` decodes to a space. (Authlib's stock basic parser
    uses `unquote`, which keeps `+`; this fixture replaces it with a strict
    form-urldecoding one, `_authenticate_basic_form_decoded` below.)

Users (password grant): alice / wonderland, bob / builder.

Scopes: every client may ask for any subset of "read write admin openid"; no scope asked means
"read write". Asking for anything else is `invalid_scope`. With `openid` (authorization code),
Authlib's OpenIDCode extension requires a `nonce` (`invalid_request` without one) and returns an
ES256 `id_token` carrying it (?test_bad_nonce=1 on the authorization request: another nonce).

Endpoints:
    POST /oauth/token      grant_type client_credentials | password | refresh_token
    POST /oauth/revoke     RFC 7009 revocation (same client authentication as the token endpoint)
    ANY  /api/<path>       protected by Authlib's ResourceProtector + RFC 6750 BearerTokenValidator.
                           200 JSON {"path", "method", "client_id", "user", "scope", "query",
                           "body_sha256", "body_length", "resource"}; the body is streamed and hashed,
                           any size; `resource`: the RFC 8707 resources the token was asked for.
                           Invalid/expired/revoked token: 401 and
                           `WWW-Authenticate: Bearer error="invalid_token", ...`.
                           Same for a missing or non-Bearer Authorization header (see `Protector`).

Test hooks (NOT OAuth; only answered to 127.0.0.1 peers):
    POST /_test/register-jwt-client              JSON {"client_id", "public_key_pem"} or {"client_id",
                                                 "jwks": {"keys": [...]}}: a private_key_jwt client
                                                 (client_credentials); with a JWKS the assertion's
                                                 `kid` must name one of its keys
    POST /_test/register-exact-redirect-client   JSON {"client_id", "redirect_uri"}: a public
                                                 authorization_code client whose redirect_uri must
                                                 equal the registered one byte for byte
    POST /_test/revoke-all                       revoke every access token issued so far
    GET  /_test/stats                            JSON counters (see `Stats.snapshot`)
    POST /_test/reset-stats                      zero the counters
    POST /_test/issue-refresh-token?client_id=cli&user=alice
                                                 mint a refresh token (JSON token response without
                                                 an access token), e.g. to seed refresh_token_file
    POST /_test/fail-next?count=1&status=503&error=temporarily_unavailable&retry_after=2&delay=0
                                                 the next `count` token requests (any grant) get
                                                 `status` with {"error": error} (empty `error`: body
                                                 `{}`), a Retry-After header when given, after
                                                 sleeping `delay` seconds. Counted in stats.
    POST /_test/clear-faults                     drop queued faults
    POST /_test/configure?token_lifetime=N&grace_seconds=N&rotate_refresh_tokens=0|1
                                                 change the flags below at run time
    POST /_test/dpop?enable=1&nonce=1&rotate_nonce=1&answer_bearer=0
                                                 RFC 9449 on the token endpoint (see "DPoP" below)
    GET  /_test/dpop-stats                       {"proofs", "nonce_demands", "bound", "failures": [...]}
    POST /_test/clock?skew=120&window=60         this server's clock runs `skew` seconds ahead of the
                                                 host's (negative: behind) and accepts iat within
                                                 `window` seconds of it; see "Clock skew" below

DPoP (RFC 9449, off until /_test/dpop?enable=1; a request with a DPoP header is checked anyway):
the proof is verified by dpop_common.verify_proof (signature with its embedded JWK, typ, htm POST,
htu the token URL, iat window, jti unique, no ath); with nonce=1 a proof without the current nonce
gets 400 {"error": "use_dpop_nonce"} and a DPoP-Nonce header (rotate_nonce=1 picks a new one).
Tokens are then JWTs bound with cnf.jkt and answered with token_type DPoP (answer_bearer=1: Bearer,
to test a client's refusal). Every answer of the token endpoint carries the current DPoP-Nonce.

Clock skew (off until /_test/clock?skew=N): every answer's `Date` header is the host's time
plus N seconds, and the times bearerd signs are checked against that clock: a private_key_jwt
assertion (RFC 7523 §3) or a DPoP proof (RFC 9449 §4.3) whose `iat` is more than `window` s
(default 60) away from it is refused (`invalid_client` / `invalid_dpop_proof`, the description names iat and the time);
the assertion's `exp`/`nbf` are checked against it too.

Flags:
    --token-lifetime SECONDS   expires_in of every access token (default 3600). 0 omits
                               expires_in from responses and the tokens never expire.
    --rotate-refresh-tokens    refresh_token grant returns a new refresh token and revokes the
                               presented one (RFC 6749 §6, RFC 9700 §4.14.2).
    --grace-seconds N          with rotation: the SAME old refresh token presented again within N
                               seconds (default 10; 0 disables) gets the SAME new pair back instead
                               of invalid_grant. An imitation of the grace windows of real servers
                               (Okta, Auth0, Keycloak...) that protect clients whose response was
                               lost in transit.
    --trailing-slash           the OAuth endpoints end in `/` (/oauth/token/, /oauth/authorize/,
                               /oauth/device/, /oauth/revoke/; the metadata says so, and the issuer
                               is `http://127.0.0.1:PORT/`) and the same paths without the slash
                               answer 404, as Django-based servers (django-oauth-toolkit) do.
                               Counted in stats as `not_found_without_slash`.
    --verbose                  werkzeug request log and Authlib debug log on stderr.
    --parent-pid PID           exit as soon as PID is no longer the parent process.
"""

import argparse
import base64
import email.utils
import hashlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from urllib.parse import unquote_plus

from flask import Flask, g, jsonify, request

from authlib.integrations.flask_oauth2 import AuthorizationServer, ResourceProtector
from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin, grants
from authlib.oauth2.rfc6749.errors import InvalidClientError, InvalidGrantError, MissingAuthorizationError, UnsupportedTokenTypeError
from authlib.oauth2.rfc6749.errors import InvalidRequestError, UnauthorizedClientError
from authlib.oauth2.rfc6750 import BearerTokenGenerator, BearerTokenValidator, InvalidTokenError
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7523 import JWTBearerClientAssertion, JWTBearerGrant
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc8628 import DeviceAuthorizationEndpoint, DeviceCodeGrant, DeviceCredentialDict
from authlib.oidc.core.grants import OpenIDCode
from joserfc.jwk import ECKey, import_key
from werkzeug.serving import WSGIRequestHandler, make_server

import dpop_common

ALL_AUTH_METHODS = ["client_secret_basic", "client_secret_post", "none", "private_key_jwt"]
SCOPES_SUPPORTED = {"read", "write", "admin", "openid"}
DEFAULT_SCOPE = "read write"


class Config:
    """Runtime configuration from the command line (set once in `main`)."""

    token_lifetime = 3600
    rotate_refresh_tokens = False
    grace_seconds = 10
    trailing_slash = False


def ep(path):
    """An OAuth endpoint's path: with a trailing slash under --trailing-slash."""
    return path + "/" if Config.trailing_slash else path


OAUTH_PATHS = ["/oauth/token", "/oauth/authorize", "/oauth/device", "/oauth/revoke"]


# ---------------------------------------------------------------------------------------
# Models (in memory)
# ---------------------------------------------------------------------------------------


class Client(ClientMixin):
    """A registered client. Immutable after start-up."""

    def __init__(self, client_id, secret, auth_method, grant_types):
        self.client_id = client_id
        self.client_secret = secret
        self.auth_method = auth_method
        self.grant_types = set(grant_types)

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None

    def is_person_client(self):
        return "authorization_code" in self.grant_types

    def get_allowed_scope(self, scope):
        if not scope:
            return DEFAULT_SCOPE
        asked = scope.split()
        if any(s not in SCOPES_SUPPORTED for s in asked):
            return None  # -> invalid_scope
        return " ".join(asked)

    def check_redirect_uri(self, redirect_uri):
        exact = getattr(self, "exact_redirect_uri", None)
        if exact is not None:
            # Like Glewlwyd and many enterprise servers: the registered URI, byte for byte.
            return self.is_person_client() and redirect_uri == exact
        # RFC 8252 §7.3: a native app's loopback redirect, any port.
        return self.is_person_client() and (
            redirect_uri.startswith("http://127.0.0.1:") or redirect_uri.startswith("http://[::1]:")
        )

    def check_client_secret(self, client_secret):
        return self.client_secret is not None and secrets.compare_digest(
            self.client_secret.encode(), client_secret.encode()
        )

    def check_endpoint_auth_method(self, method, endpoint):
        return method == self.auth_method

    def check_response_type(self, response_type):
        return response_type == "code" and self.is_person_client()

    def check_grant_type(self, grant_type):
        return grant_type in self.grant_types


CLIENTS = {
    c.client_id: c
    for c in [
        Client("svc", "svc-secret", "client_secret_basic", ["client_credentials"]),
        Client("svc-post", "post-secret", "client_secret_post", ["client_credentials"]),
        Client("app", "app-secret", "client_secret_basic", ["password", "refresh_token"]),
        Client("cli", None, "none", ["password", "refresh_token"]),
        Client("we:ird", "p@ss w+rd/:", "client_secret_basic", ["client_credentials"]),
        # A native app (bearerd login): public client, authorization code with PKCE (RFC 8252).
        Client("native", None, "none", ["authorization_code", "refresh_token"]),
        # A device without a browser (RFC 8628): public client, device code.
        Client("tv", None, "none", ["urn:ietf:params:oauth:grant-type:device_code", "refresh_token"]),
    ]
}

USERS = {"alice": "wonderland", "bob": "builder"}


class Token(TokenMixin):
    """One token response as issued: an access token and/or a refresh token.

    `rotated_to` is set when the refresh token was rotated: it is the response that
    replaced it (returned again within the grace window) and `rotated_at` its time.
    """

    def __init__(self, client_id, user, scope, access_token, refresh_token, expires_in):
        self.client_id = client_id
        self.user = user
        self.scope = scope
        self.access_token = access_token
        self.refresh_token = refresh_token
        self.expires_in = expires_in or 0
        self.issued_at = time.time()
        self.access_revoked = False
        self.refresh_revoked = False
        self.rotated_to = None
        self.rotated_at = None

    def check_client(self, client):
        return self.client_id == client.get_client_id()

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.expires_in

    def is_expired(self):
        return self.expires_in > 0 and time.time() >= self.issued_at + self.expires_in

    def is_revoked(self):
        return self.access_revoked

    def get_user(self):
        return self.user

    def get_client(self):
        return CLIENTS.get(self.client_id)


class Store:
    """All tokens, indexed by access and by refresh token. Guarded by `lock` (the server
    is threaded); the token and revocation endpoints hold it for the whole request so
    refreshes are serialized like in a database transaction."""

    def __init__(self):
        self.lock = threading.RLock()
        self.by_access = {}
        self.by_refresh = {}

    def add(self, token):
        with self.lock:
            if token.access_token:
                self.by_access[token.access_token] = token
            if token.refresh_token:
                self.by_refresh[token.refresh_token] = token

    def revoke_all_access(self):
        with self.lock:
            n = 0
            for t in self.by_access.values():
                if not t.access_revoked:
                    t.access_revoked = True
                    n += 1
            return n


class Stats:
    """Counters for test assertions. Guarded by its own lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.token_requests = 0
            self.by_grant = {}
            self.by_client = {}
            self.token_errors = {}
            self.tokens_issued = 0
            self.grace_replays = 0
            self.refresh_token_reuses = 0
            self.revocations = 0
            self.api_requests = 0
            self.api_rejected = 0
            self.injected_faults = 0
            self.not_found_without_slash = 0

    def snapshot(self):
        with self.lock:
            return {
                "token_requests": self.token_requests,
                "by_grant": dict(self.by_grant),
                "by_client": dict(self.by_client),
                "token_errors": dict(self.token_errors),
                "tokens_issued": self.tokens_issued,
                "grace_replays": self.grace_replays,
                "refresh_token_reuses": self.refresh_token_reuses,
                "revocations": self.revocations,
                "api_requests": self.api_requests,
                "api_rejected": self.api_rejected,
                "injected_faults": self.injected_faults,
                "not_found_without_slash": self.not_found_without_slash,
            }


class Fault:
    """One scripted token-endpoint answer from `/_test/fail-next`."""

    def __init__(self, status, error, retry_after, delay):
        self.status = status
        self.error = error
        self.retry_after = retry_after
        self.delay = delay

    def response(self):
        if self.delay > 0:
            time.sleep(self.delay)
        body = {"error": self.error, "error_description": "injected by /_test/fail-next"} if self.error else {}
        resp = jsonify(body)
        resp.status_code = self.status
        resp.headers["Cache-Control"] = "no-store"
        if self.retry_after is not None:
            resp.headers["Retry-After"] = self.retry_after
        with STATS.lock:
            STATS.injected_faults += 1
            if self.error:
                _bump(STATS.token_errors, self.error)
        return resp


class Faults:
    """Queue of scripted token-endpoint answers, consumed one per token request. Guarded by `lock`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queue = []

    def add(self, fault, count):
        with self.lock:
            self.queue.extend([fault] * count)

    def take(self):
        with self.lock:
            return self.queue.pop(0) if self.queue else None

    def clear(self):
        with self.lock:
            self.queue.clear()


STORE = Store()
STATS = Stats()
FAULTS = Faults()


def _bump(d, key):
    d[key] = d.get(key, 0) + 1


# ---------------------------------------------------------------------------------------
# Authorization server
# ---------------------------------------------------------------------------------------


def _split_basic(headers):
    """RFC 6749 §2.3.1: base64(form_urlencode(id) ":" form_urlencode(secret))."""
    auth = headers.get("Authorization")
    if not auth or " " not in auth:
        return None, None
    scheme, value = auth.split(None, 1)
    if scheme.lower() != "basic":
        return None, None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
    except Exception:
        return None, None
    if ":" not in decoded:
        return None, None
    cid, secret = decoded.split(":", 1)
    return unquote_plus(cid), unquote_plus(secret)


def _authenticate_basic_form_decoded(query_client, req):
    """client_secret_basic with form-urldecoding (space as `+`), unlike Authlib's stock
    parser which uses `unquote` and would turn an encoded space into a literal `+`."""
    cid, secret = _split_basic(req.headers)
    if cid and secret:
        client = query_client(cid)
        if client and client.check_client_secret(secret):
            return client
    return None


def query_client(client_id):
    return CLIENTS.get(client_id)


def save_token(token, req):
    user = getattr(req, "user", None)
    client = req.client
    t = Token(
        client.get_client_id(),
        user,
        token.get("scope"),
        token.get("access_token"),
        token.get("refresh_token"),
        token.get("expires_in"),
    )
    # RFC 8707: the resource indicators the token was asked for (shown by /api/ as `resource`).
    t.resource = request.form.getlist("resource")
    STORE.add(t)
    with STATS.lock:
        STATS.tokens_issued += 1
    req._saved_token_record = t


class ClientCredentialsGrant(grants.ClientCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ALL_AUTH_METHODS


class PasswordGrant(grants.ResourceOwnerPasswordCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ALL_AUTH_METHODS

    def authenticate_user(self, username, password):
        expected = USERS.get(username)
        if expected is not None and secrets.compare_digest(expected, password):
            return username
        return None


class RefreshTokenGrant(grants.RefreshTokenGrant):
    """RFC 6749 §6. Without rotation the refresh token stays valid and the response
    carries no refresh_token; with rotation see `--rotate-refresh-tokens`."""

    TOKEN_ENDPOINT_AUTH_METHODS = ALL_AUTH_METHODS

    @property
    def INCLUDE_NEW_REFRESH_TOKEN(self):  # noqa: N802 (Authlib's attribute name)
        return Config.rotate_refresh_tokens

    def authenticate_refresh_token(self, refresh_token):
        t = STORE.by_refresh.get(refresh_token)
        if t is None:
            return None
        if not t.refresh_revoked:
            return t
        # Grace window: a rotated token presented again soon gets the same new pair.
        if (
            t.rotated_to is not None
            and Config.grace_seconds > 0
            and time.time() - t.rotated_at <= Config.grace_seconds
        ):
            return t
        if t.rotated_to is not None:
            # A rotated refresh token presented again outside the grace window: what servers with
            # reuse detection take as theft (and revoke the whole lineage for).
            with STATS.lock:
                STATS.refresh_token_reuses += 1
        return None

    def authenticate_user(self, refresh_token):
        return refresh_token.user

    def create_token_response(self):
        old = self.request.refresh_token
        if old.refresh_revoked and old.rotated_to is not None:
            if self.request.payload.scope:
                raise InvalidGrantError("Rotated refresh token replayed with a different scope.")
            with STATS.lock:
                STATS.grace_replays += 1
            return 200, dict(old.rotated_to), self.TOKEN_RESPONSE_HEADER
        status, body, headers = super().create_token_response()
        if Config.rotate_refresh_tokens and status == 200:
            old.rotated_to = dict(body)
            old.rotated_at = time.time()
        return status, body, headers

    def revoke_old_credential(self, refresh_token):
        if Config.rotate_refresh_tokens:
            refresh_token.refresh_revoked = True


class AuthCode:
    """One authorization code (single use, 60 s), with its PKCE challenge (RFC 7636)."""

    def __init__(self, code, client_id, redirect_uri, scope, user, challenge, method, nonce=None):
        self.code = code
        self.nonce = nonce
        self.client_id = client_id
        self.redirect_uri = redirect_uri
        self.scope = scope
        self.user = user
        self.code_challenge = challenge
        self.code_challenge_method = method
        self.created = time.time()

    def get_redirect_uri(self):
        return self.redirect_uri

    def get_scope(self):
        return self.scope

    def is_expired(self):
        return time.time() - self.created > 60

    # OpenID Connect (authlib.oidc.core.AuthorizationCodeMixin)
    def get_nonce(self):
        return self.nonce

    def get_auth_time(self):
        return int(self.created)

    def get_acr(self):
        return None

    def get_amr(self):
        return None


CODES = {}
ID_TOKEN_KEY = ECKey.generate_key("P-256")


class OpenIDCodeRequiringNonce(OpenIDCode):
    """OIDC Core §3.1: a `nonce` is required when the scope holds `openid` (as some servers
    require); the id_token (ES256, a key made at start) carries it back."""

    def __init__(self):
        super().__init__(require_nonce=True)

    def exists_nonce(self, nonce, request):
        return False

    def resolve_client_private_key(self, client):
        return ID_TOKEN_KEY

    def get_client_algorithm(self, client):
        return "ES256"

    def get_client_claims(self, client):
        base = "http://127.0.0.1:%s" % request.environ.get("SERVER_PORT", "")
        return {"iss": base + "/" if Config.trailing_slash else base, "aud": [client.get_client_id()]}

    def generate_user_info(self, user, scope):
        return {"sub": user}


class AuthorizationCodeGrant(grants.AuthorizationCodeGrant):
    """RFC 6749 §4.1 with PKCE required (RFC 7636, CodeChallenge(required=True))."""

    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]

    def save_authorization_code(self, code, request):
        payload = getattr(request, "payload", request)
        data = getattr(payload, "data", None) or request.args
        nonce = data.get("nonce")
        if nonce and request.args.get("test_bad_nonce"):
            nonce = "not-" + nonce  # a substituted id_token, for the client's check
        CODES[code] = AuthCode(
            code,
            request.client.get_client_id(),
            payload.redirect_uri,
            payload.scope,
            request.user,
            data.get("code_challenge"),
            data.get("code_challenge_method"),
            nonce,
        )

    def query_authorization_code(self, code, client):
        item = CODES.get(code)
        if item is not None and item.client_id == client.get_client_id() and not item.is_expired():
            return item
        return None

    def delete_authorization_code(self, authorization_code):
        CODES.pop(authorization_code.code, None)

    def authenticate_user(self, authorization_code):
        return authorization_code.user


JTIS = set()  # client assertion ids seen (RFC 7523 §3: a jti is used once)


class PrivateKeyJWTAuth(JWTBearerClientAssertion):
    """RFC 7523 §2.2 / OIDC Core §9 `private_key_jwt`: the client signs a JWT with its key; the
    server checks it with the public key registered for the client (`/_test/register-jwt-client`)."""

    CLIENT_AUTH_METHOD = "private_key_jwt"

    def get_audiences(self):
        base = "http://127.0.0.1:%s" % request.environ.get("SERVER_PORT", "")
        return [base + ep("/oauth/token"), base]

    def validate_jti(self, claims, jti):
        with STATS.lock:
            if jti in JTIS:
                _bump(STATS.token_errors, "replayed_jti")
                return False
            JTIS.add(jti)
        return True

    def extract_assertion(self, assertion):
        headers, claims = super().extract_assertion(assertion)
        g.assertion_kid = headers.get("kid")
        return headers, claims

    def verify_claims(self, claims):
        if not Clock.skew:
            return super().verify_claims(claims)
        # A skewed server (Clock below): Authlib's checks against this server's clock, and an
        # iat more than 60 s from it refused (RFC 7523 §3 lets a server bound a JWT's age).
        now = server_now()
        iat = claims.get("iat")
        if not isinstance(iat, int) or abs(now - iat) > Clock.IAT_WINDOW:
            with STATS.lock:
                _bump(STATS.token_errors, "assertion_time")
            raise InvalidClientError(description="assertion iat %r is outside the time window of the server's clock (%d)" % (iat, now))
        options = {"iss": {"essential": True}, "sub": {"essential": True},
                   "aud": {"essential": True, "values": self.get_audiences()}, "exp": {"essential": True}}
        try:
            _jose_jwt.JWTClaimsRegistry(now=now, leeway=self.leeway, **options).validate(claims)
        except Exception as e:  # noqa: BLE001 joserfc's errors, reported as Authlib does
            raise InvalidClientError(description=getattr(e, "description", str(e)))
        if claims["sub"] != claims["iss"]:
            raise InvalidClientError(description="Issuer and Subject MUST match.")
        if "jti" not in claims or not self.validate_jti(claims, claims["jti"]):
            raise InvalidClientError(description="JWT ID is missing or used before.")

    def resolve_client_public_key(self, client):
        jwks = getattr(client, "public_jwks", None)
        if jwks is None:
            return client.public_key_pem
        # A client registered with a JWKS (as Glewlwyd and most servers keep them): the
        # assertion's `kid` picks the key; none, or an unknown one, is refused.
        kid = g.get("assertion_kid")
        for k in jwks["keys"]:
            if kid is not None and k.get("kid") == kid:
                return import_key(k)
        with STATS.lock:
            _bump(STATS.token_errors, "unknown_kid")
        raise InvalidClientError(description="no key of this client has kid %r" % (kid,))


DEVICES = {}  # device_code -> DeviceCredentialDict
USER_GRANTS = {}  # user_code -> (user, approved)


class DeviceEndpoint(DeviceAuthorizationEndpoint):
    """RFC 8628 §3.1-3.2. A 2 s polling interval keeps the tests short."""

    CLIENT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]
    INTERVAL = 2
    EXPIRES_IN = 60

    def get_verification_uri(self):
        return "http://127.0.0.1:%s/device" % request.environ.get("SERVER_PORT", "")

    def save_device_credential(self, client_id, scope, data):
        DEVICES[data["device_code"]] = DeviceCredentialDict(
            client_id=client_id, scope=scope, expires_at=time.time() + self.EXPIRES_IN, polls=[], **data
        )


class DeviceGrant(DeviceCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_basic", "client_secret_post"]

    def query_device_credential(self, device_code):
        return DEVICES.get(device_code)

    def query_user_grant(self, user_code):
        return USER_GRANTS.get(user_code)

    def should_slow_down(self, credential):
        # RFC 8628 §3.5: polling faster than the interval earns slow_down.
        now = time.time()
        polls = credential["polls"]
        fast = bool(polls) and now - polls[-1] < DeviceEndpoint.INTERVAL - 0.5
        polls.append(now)
        with STATS.lock:
            _bump(STATS.by_grant, "device_poll_fast" if fast else "device_poll")
        return fast


class Revocation(RevocationEndpoint):
    """RFC 7009. Revoking an access token revokes only it; revoking a refresh token
    revokes it and the access token issued with it (RFC 7009 §2.1 allows both)."""

    CLIENT_AUTH_METHODS = ALL_AUTH_METHODS

    def query_token(self, token_string, token_type_hint):
        if token_type_hint == "refresh_token":
            return STORE.by_refresh.get(token_string) or STORE.by_access.get(token_string)
        return STORE.by_access.get(token_string) or STORE.by_refresh.get(token_string)

    def revoke_token(self, token, req):
        s = req.form.get("token")
        token.access_revoked = True
        if s is not None and s == token.refresh_token:
            token.refresh_revoked = True
            token.rotated_to = None
        with STATS.lock:
            STATS.revocations += 1


class Protector(ResourceProtector):
    """Authlib's ResourceProtector, except that a request with no (or a non-Bearer)
    Authorization header also gets `401` + `WWW-Authenticate: Bearer error="invalid_token"`
    (stock Authlib says `bearer error="missing_authorization"`; RFC 6750 §3.1 would send no
    error code at all). Keeps every /api rejection uniform for the proxy's tests."""

    def parse_request_authorization(self, req):
        try:
            return super().parse_request_authorization(req)
        except (MissingAuthorizationError, UnsupportedTokenTypeError):
            raise InvalidTokenError(description="Missing or non-Bearer Authorization header.") from None


class BearerValidator(BearerTokenValidator):
    def authenticate_token(self, token_string):
        with STORE.lock:
            return STORE.by_access.get(token_string)


# ---------------------------------------------------------------------------------------
# Workload identity (W1): RFC 7523 §2.1 JWT bearer grant, RFC 8693 token exchange, and
# client authentication with an externally signed JWT (a federated credential).
#
# A test "cluster" issuer (like the Kubernetes API server signing projected service-account
# tokens) has an ES256 key made at start-up; the authorization server trusts JWTs of the
# issuers in TRUSTED_ISSUERS (the cluster's, and any registered by a test with its JWKS),
# verified with joserfc against that JWKS.
#
# Hooks (loopback only):
#   POST /_test/workload/mint      JSON {"sub", "aud", "exp_in" (s, default 600, negative:
#                                  expired), "jti"?, "iss"?}: a JWT signed by the cluster key
#                                  -> {"jwt", "jti"}
#   POST /_test/workload/trust     JSON {"issuer", "jwks": {"keys": [...]}}: trust another issuer
#   POST /_test/workload/federated-client
#                                  JSON {"client_id", "issuer"?, "subject", "audience"?}: a client
#                                  authenticated by a JWT of that issuer with that `sub` and `aud`
#                                  (default: the token endpoint URL); grants client_credentials,
#                                  jwt-bearer and token-exchange
#   GET  /_test/workload/log       every workload token request: grant, client_id, assertion or
#                                  subject `sub`/`jti`, actor `sub`, audiences, resources, outcome
#
# JWT bearer grant: the assertion's `iss` must be a trusted issuer; its client is the issuer
# itself (a public client registered on trust). `aud` must be the token endpoint URL or the
# issuer URL of this server. Token exchange: `subject_token` is a JWT of a trusted issuer
# (type ...:jwt or ...:id_token) or an access token this server issued, not revoked or expired
# (...:access_token); anything else is `invalid_grant`. The issued token's `user` is the
# subject's `sub` (or the subject token's user); `issued_token_type` is the requested type, or
# ...:access_token.
# ---------------------------------------------------------------------------------------

from joserfc import jwt as _jose_jwt
from joserfc.jwk import KeySet as _KeySet

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
TT_JWT = "urn:ietf:params:oauth:token-type:jwt"
TT_ID = "urn:ietf:params:oauth:token-type:id_token"
TT_ACCESS = "urn:ietf:params:oauth:token-type:access_token"
CLIENT_ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
CLUSTER_ISSUER = "https://kubernetes.test"
CLUSTER_KEY = ECKey.generate_key("P-256", parameters={"kid": "cluster-1", "alg": "ES256"}, private=True)
TRUSTED_ISSUERS = {CLUSTER_ISSUER: _KeySet([CLUSTER_KEY])}
WORKLOAD_LOG = []  # guarded by STATS.lock
WORKLOAD_JTIS = set()


def _workload_client(client_id, auth_method="none"):
    return Client(client_id, None, auth_method, ["client_credentials", JWT_BEARER, TOKEN_EXCHANGE])


# The issuer of a trusted JWT is a public client for the JWT bearer grant; `sts` is the public
# client of exchanges that send no client credentials at all (bearerd's default client_auth: none).
CLIENTS[CLUSTER_ISSUER] = _workload_client(CLUSTER_ISSUER)
CLIENTS["sts"] = _workload_client("sts")


def _token_endpoint_audiences():
    base = "http://127.0.0.1:%s" % request.environ.get("SERVER_PORT", "")
    return [base + ep("/oauth/token"), base]


def verify_workload_jwt(token, what, audiences=None):
    """Verifies a JWT of a trusted issuer (signature, exp, optionally aud); returns its claims
    or raises InvalidGrantError naming `what`."""
    from joserfc import jws as _jws
    import json as _json

    try:
        unverified = _json.loads(_jws.extract_compact(token.encode()).payload)
        issuer = unverified.get("iss")
    except Exception:
        raise InvalidGrantError(description="%s is not a JWT" % what) from None
    keys = TRUSTED_ISSUERS.get(issuer)
    if keys is None:
        raise InvalidGrantError(description="%s: issuer %r is not trusted" % (what, issuer))
    try:
        obj = _jose_jwt.decode(token, keys, algorithms=["ES256", "RS256"])
        options = {"exp": {"essential": True}, "iss": {"essential": True, "value": issuer}}
        if audiences is not None:
            options["aud"] = {"essential": True, "values": audiences}
        _jose_jwt.JWTClaimsRegistry(leeway=5, **options).validate(obj.claims)
    except InvalidGrantError:
        raise
    except Exception as e:
        raise InvalidGrantError(description="%s: %s" % (what, getattr(e, "description", None) or e)) from None
    return obj.claims


def _log_workload(entry):
    entry["audience"] = request.form.getlist("audience")
    entry["resource"] = request.form.getlist("resource")
    with STATS.lock:
        WORKLOAD_LOG.append(entry)


class WorkloadJWTBearerGrant(JWTBearerGrant):
    """RFC 7523 §2.1 with Authlib's grant: the client is the assertion's trusted issuer."""

    def get_audiences(self):
        return _token_endpoint_audiences()

    def resolve_issuer_client(self, issuer):
        return CLIENTS.get(issuer) if issuer in TRUSTED_ISSUERS else None

    def resolve_client_public_key(self, client):
        return TRUSTED_ISSUERS[client.client_id]

    def authenticate_user(self, subject):
        return subject

    def has_granted_permission(self, client, user):
        return True

    def validate_token_request(self):
        entry = {"grant": "jwt_bearer"}
        try:
            assertion = self.request.form.get("assertion") or ""
            try:
                from joserfc import jws as _jws
                import json as _json

                c = _json.loads(_jws.extract_compact(assertion.encode()).payload)
                entry["sub"], entry["jti"] = c.get("sub"), c.get("jti")
            except Exception:
                pass
            super().validate_token_request()
            entry["outcome"] = "ok"
        except Exception as e:
            entry["outcome"] = getattr(e, "error", "error")
            raise
        finally:
            _log_workload(entry)


class TokenExchangeGrant(grants.BaseGrant, grants.TokenEndpointMixin):
    """RFC 8693 §2.1-2.2 (Authlib 1.x has no built-in grant for it)."""

    GRANT_TYPE = TOKEN_EXCHANGE
    TOKEN_ENDPOINT_AUTH_METHODS = ALL_AUTH_METHODS

    def _has_client_credentials(self):
        f = self.request.form
        return bool(self.request.headers.get("Authorization") or f.get("client_id") or f.get("client_assertion"))

    def _subject(self, token, token_type, what):
        if token_type in (TT_JWT, TT_ID):
            claims = verify_workload_jwt(token, what)
            return claims.get("sub"), claims.get("jti")
        if token_type == TT_ACCESS:
            with STORE.lock:
                t = STORE.by_access.get(token)
            if t is None or t.access_revoked or t.is_expired():
                raise InvalidGrantError(description="%s: unknown, revoked or expired access token" % what)
            return t.user or t.client_id, None
        raise InvalidRequestError(description="%s: unsupported token type %r" % (what, token_type))

    def validate_token_request(self):
        f = self.request.form
        entry = {"grant": "token_exchange", "subject_token_type": f.get("subject_token_type"),
                 "requested_token_type": f.get("requested_token_type")}
        try:
            client = self.authenticate_token_endpoint_client() if self._has_client_credentials() else CLIENTS["sts"]
            entry["client_id"] = client.get_client_id()
            if not client.check_grant_type(self.GRANT_TYPE):
                raise UnauthorizedClientError("client may not exchange tokens")
            self.request.client = client
            subject, stype = f.get("subject_token"), f.get("subject_token_type")
            if not subject or not stype:
                raise InvalidRequestError(description="subject_token and subject_token_type are required")
            entry["sub"], entry["jti"] = self._subject(subject, stype, "subject_token")
            actor = f.get("actor_token")
            if actor:
                if not f.get("actor_token_type"):
                    raise InvalidRequestError(description="actor_token_type is required with actor_token")
                entry["actor_sub"], _ = self._subject(actor, f.get("actor_token_type"), "actor_token")
            self.request.user = entry["sub"]
            self.validate_requested_scope()
            entry["outcome"] = "ok"
        except Exception as e:
            entry["outcome"] = getattr(e, "error", "error")
            raise
        finally:
            _log_workload(entry)

    def create_token_response(self):
        token = self.generate_token(scope=self.request.payload.scope, user=self.request.user, include_refresh_token=False)
        token["issued_token_type"] = self.request.form.get("requested_token_type") or TT_ACCESS
        self.save_token(token)
        return 200, token, self.TOKEN_RESPONSE_HEADER


def authenticate_federated_client(query_client, req):
    """A client authenticated by an externally signed JWT (RFC 7523 §2.2 with a federated
    credential, as Azure/GCP workload identity federation do): `client_id` names the client,
    the assertion is a JWT of the client's trusted issuer with the registered `sub` and `aud`."""
    f = req.form
    if f.get("client_assertion_type") != CLIENT_ASSERTION_TYPE or not f.get("client_assertion"):
        return None
    client = query_client(f.get("client_id") or "")
    fed = getattr(client, "federation", None)
    if fed is None:
        return None
    try:
        claims = verify_workload_jwt(f["client_assertion"], "client_assertion", audiences=[fed["audience"]] if fed.get("audience") else _token_endpoint_audiences())
    except InvalidGrantError as e:
        raise InvalidClientError(description=e.description) from None
    if claims.get("iss") != fed["issuer"] or claims.get("sub") != fed["subject"]:
        raise InvalidClientError(description="the client assertion's iss/sub are not this client's federated credential")
    with STATS.lock:
        WORKLOAD_LOG.append({"grant": "client_assertion", "client_id": client.client_id, "sub": claims.get("sub"),
                             "jti": claims.get("jti"), "outcome": "ok"})
    return client


# Tried before private_key_jwt (which would take the foreign `sub` for a client id and refuse).
ALL_AUTH_METHODS.insert(ALL_AUTH_METHODS.index("private_key_jwt"), "federated_jwt")


def register_workload_identity(app, server):
    server.register_client_auth_method("federated_jwt", authenticate_federated_client)
    server.register_grant(WorkloadJWTBearerGrant)
    server.register_grant(TokenExchangeGrant)

    @app.post("/_test/workload/mint")
    def hook_workload_mint():
        body = request.get_json(force=True, silent=True) or {}
        now = int(time.time())
        jti = body.get("jti") or secrets.token_hex(8)
        claims = {"iss": body.get("iss", CLUSTER_ISSUER), "sub": body.get("sub", "system:serviceaccount:default:bearerd"),
                  "aud": body.get("aud"), "iat": now, "nbf": now, "exp": now + int(body.get("exp_in", 600)), "jti": jti}
        token = _jose_jwt.encode({"alg": "ES256", "kid": "cluster-1"}, claims, CLUSTER_KEY)
        return jsonify(jwt=token, jti=jti)

    @app.post("/_test/workload/trust")
    def hook_workload_trust():
        body = request.get_json(force=True, silent=True) or {}
        TRUSTED_ISSUERS[body["issuer"]] = _KeySet.import_key_set(body["jwks"])
        CLIENTS.setdefault(body["issuer"], _workload_client(body["issuer"]))
        return jsonify(ok=True)

    @app.post("/_test/workload/federated-client")
    def hook_workload_federated_client():
        body = request.get_json(force=True, silent=True) or {}
        c = _workload_client(body["client_id"], "federated_jwt")
        c.federation = {"issuer": body.get("issuer", CLUSTER_ISSUER), "subject": body["subject"], "audience": body.get("audience")}
        CLIENTS[c.client_id] = c
        return jsonify(ok=True)

    @app.get("/_test/workload/log")
    def hook_workload_log():
        with STATS.lock:
            return jsonify(list(WORKLOAD_LOG))


# ---------------------------------------------------------------------------------------
# Flask app
# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------
# DPoP on the token endpoint (RFC 9449 §5, §8): kept apart from the grants above
# ---------------------------------------------------------------------------------------


class Clock:
    """/_test/clock: this server's clock runs `skew` seconds off the host's (Date headers and
    the checks of what clients sign)."""

    skew = 0
    IAT_WINDOW = 60


def server_now():
    return int(time.time()) + Clock.skew


class SkewedDateRequestHandler(WSGIRequestHandler):
    """The `Date` header werkzeug (http.server) writes on every answer, from this server's clock."""

    def date_time_string(self, timestamp=None):
        return email.utils.formatdate(server_now() if timestamp is None else timestamp, usegmt=True)


class DPoPState:
    lock = threading.Lock()
    enabled = False
    nonce = None  # the nonce proofs must carry, or None
    answer_bearer = False
    jtis = dpop_common.JtiCache()
    proofs = 0
    nonce_demands = 0
    bound = 0
    failures = []


def _dpop_nonce_headers():
    return {"DPoP-Nonce": DPoPState.nonce} if DPoPState.nonce else {}


def dpop_check_token_request():
    """None: no DPoP; a jkt: a valid proof; a (response, status, headers) tuple: refused."""
    proof = request.headers.get("DPoP")
    if not DPoPState.enabled and proof is None:
        return None
    try:
        _, jkt = dpop_common.verify_proof(proof, "POST", request.base_url, DPoPState.jtis, nonce=DPoPState.nonce, now=server_now())
    except dpop_common.ProofError as e:
        with DPoPState.lock:
            if e.error == "use_dpop_nonce":
                DPoPState.nonce_demands += 1
            else:
                DPoPState.failures.append(e.description)
        return jsonify(error=e.error, error_description=e.description), 400, _dpop_nonce_headers()
    with DPoPState.lock:
        DPoPState.proofs += 1
    return jkt


def dpop_bind(resp, jkt):
    """A successful token response with its access token replaced by one bound to `jkt`."""
    for k, v in _dpop_nonce_headers().items():
        resp.headers[k] = v
    if resp.status_code != 200:
        return resp
    body = resp.get_json(silent=True) or {}
    if "access_token" not in body:
        return resp
    body["access_token"] = dpop_common.bound_token(_split_basic(request.headers)[0] or request.form.get("client_id", "-"), jkt, int(body.get("expires_in") or 3600))
    body["token_type"] = "Bearer" if DPoPState.answer_bearer else "DPoP"
    with DPoPState.lock:
        DPoPState.bound += 1
    out = jsonify(body)
    for k, v in _dpop_nonce_headers().items():
        out.headers[k] = v
    out.headers["Cache-Control"] = "no-store"
    return out


def create_app():
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = None  # /api accepts bodies of any size
    server = AuthorizationServer(app, query_client, save_token)
    # Opaque random tokens; expires_in follows --token-lifetime for every grant
    # (0: no expires_in member, see BearerTokenGenerator.generate).
    server.register_token_generator(
        "default",
        BearerTokenGenerator(
            lambda **kw: secrets.token_urlsafe(32),
            lambda **kw: secrets.token_urlsafe(32),
            lambda client, grant_type: Config.token_lifetime,
        ),
    )
    server.register_client_auth_method("client_secret_basic", _authenticate_basic_form_decoded)
    server.register_client_auth_method(PrivateKeyJWTAuth.CLIENT_AUTH_METHOD, PrivateKeyJWTAuth())
    server.register_grant(ClientCredentialsGrant)
    server.register_grant(PasswordGrant)
    server.register_grant(RefreshTokenGrant)
    server.register_grant(AuthorizationCodeGrant, [CodeChallenge(required=True), OpenIDCodeRequiringNonce()])
    server.register_grant(DeviceGrant)
    server.register_endpoint(DeviceEndpoint)
    server.register_endpoint(Revocation)
    register_workload_identity(app, server)  # RFC 7523 §2.1, RFC 8693, federated client assertions

    require_oauth = Protector()
    require_oauth.register_token_validator(BearerValidator())

    def claimed_client_id():
        cid, _ = _split_basic(request.headers)
        return cid or request.form.get("client_id") or "-"

    @app.before_request
    def no_slash_no_endpoint():
        # --trailing-slash: Django answers 404 to /authorize when the route is /authorize/
        # (werkzeug would redirect; a client following the redirect would hide the bug).
        if Config.trailing_slash and request.path in OAUTH_PATHS:
            with STATS.lock:
                STATS.not_found_without_slash += 1
            return jsonify(error="not_found", detail="this server's endpoints end in /"), 404
        return None

    @app.post(ep("/oauth/token"))
    def issue_token():
        grant = request.form.get("grant_type") or "-"
        cid = claimed_client_id()
        with STATS.lock:
            STATS.token_requests += 1
            _bump(STATS.by_grant, grant)
            _bump(STATS.by_client, cid)
        fault = FAULTS.take()
        if fault is not None:
            return fault.response()
        dpop_jkt = dpop_check_token_request()
        if isinstance(dpop_jkt, tuple):
            return dpop_jkt
        with STORE.lock:
            resp = server.create_token_response()
        if dpop_jkt is not None:
            resp = dpop_bind(resp, dpop_jkt)
        if resp.status_code != 200:
            try:
                err = (resp.get_json(silent=True) or {}).get("error", "unknown")
            except Exception:
                err = "unknown"
            with STATS.lock:
                _bump(STATS.token_errors, err)
        return resp

    @app.get(ep("/oauth/authorize"))
    def authorize():
        # No login page: the test user signs in at once (?test_user=bob picks another one,
        # ?test_deny=1 refuses, as a person pressing "Deny" would).
        with STATS.lock:
            _bump(STATS.by_grant, "authorize")
        if request.args.get("test_deny"):
            return server.create_authorization_response(grant_user=None)
        return server.create_authorization_response(grant_user=request.args.get("test_user", "alice"))

    def metadata():
        # The issuer is fixed (127.0.0.1 and the listening port), whatever Host the client sent:
        # a client that configured another name must notice the mismatch (RFC 8414 §3.3).
        base = "http://127.0.0.1:%s" % request.environ.get("SERVER_PORT", "")
        return {
            "issuer": base + "/" if Config.trailing_slash else base,
            "authorization_endpoint": base + ep("/oauth/authorize"),
            "token_endpoint": base + ep("/oauth/token"),
            "device_authorization_endpoint": base + ep("/oauth/device"),
            "revocation_endpoint": base + ep("/oauth/revoke"),
            "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post", "none", "private_key_jwt"],
            "grant_types_supported": ["authorization_code", "refresh_token", "client_credentials", "password"],
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "scopes_supported": sorted(SCOPES_SUPPORTED),
        }

    @app.post(ep("/oauth/device"))
    def device_authorization():
        with STORE.lock:
            return server.create_endpoint_response(DeviceEndpoint.ENDPOINT_NAME)

    @app.post("/_test/register-jwt-client")
    def hook_register_jwt_client():
        body = request.get_json(force=True, silent=True) or {}
        c = Client(body["client_id"], None, "private_key_jwt", ["client_credentials"])
        c.public_key_pem = body.get("public_key_pem")
        if "jwks" in body:
            c.public_jwks = body["jwks"]  # {"keys": [JWK with kid, ...]}: the assertion's kid must name one
        CLIENTS[c.client_id] = c
        return jsonify(ok=True)

    @app.post("/_test/register-exact-redirect-client")
    def hook_register_exact_redirect_client():
        # A public native client whose redirect URI is compared exactly (no loopback port freedom).
        body = request.get_json(force=True, silent=True) or {}
        c = Client(body["client_id"], None, "none", ["authorization_code", "refresh_token"])
        c.exact_redirect_uri = body["redirect_uri"]
        CLIENTS[c.client_id] = c
        return jsonify(ok=True)

    @app.post("/_test/device/approve")
    def hook_device_approve():
        # What a person does at the verification page: enter the code, then allow or deny.
        body = request.get_json(force=True, silent=True) or {}
        USER_GRANTS[body.get("user_code", "")] = (body.get("user", "alice"), bool(body.get("approve", True)))
        return jsonify(ok=True)

    @app.get("/.well-known/oauth-authorization-server")
    def rfc8414_metadata():
        return jsonify(metadata())

    @app.get("/.well-known/openid-configuration")
    def oidc_metadata():
        return jsonify(metadata())

    @app.post(ep("/oauth/revoke"))
    def revoke_token():
        with STORE.lock:
            return server.create_endpoint_response(Revocation.ENDPOINT_NAME)

    @app.route(
        "/api/",
        defaults={"path": ""},
        methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"],
    )
    @app.route("/api/<path:path>", methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
    def api(path):
        with STATS.lock:
            STATS.api_requests += 1
        try:
            with require_oauth.acquire() as token:
                h = hashlib.sha256()
                n = 0
                stream = request.stream
                while True:
                    chunk = stream.read(65536)
                    if not chunk:
                        break
                    h.update(chunk)
                    n += len(chunk)
                return jsonify(
                    path="/api/" + path,
                    method=request.method,
                    client_id=token.client_id,
                    user=token.user,
                    scope=token.scope,
                    query=request.query_string.decode("latin-1"),
                    body_sha256=h.hexdigest(),
                    body_length=n,
                    resource=getattr(token, "resource", []),
                )
        except Exception as e:
            # HTTPException raised by Authlib for 401/403: count it and pass it on.
            if getattr(e, "code", None) in (401, 403):
                with STATS.lock:
                    STATS.api_rejected += 1
            raise

    # ---- test hooks (loopback only) ------------------------------------------------

    @app.before_request
    def loopback_only_for_hooks():
        if request.path.startswith("/_test/") and request.remote_addr not in ("127.0.0.1", "::1"):
            return jsonify(error="forbidden"), 403
        return None

    @app.post("/_test/revoke-all")
    def hook_revoke_all():
        return jsonify(revoked=STORE.revoke_all_access())

    @app.get("/_test/stats")
    def hook_stats():
        return jsonify(STATS.snapshot())

    @app.post("/_test/reset-stats")
    def hook_reset_stats():
        STATS.reset()
        return jsonify(ok=True)

    @app.post("/_test/fail-next")
    def hook_fail_next():
        a = request.args
        try:
            count = int(a.get("count", "1"))
            status = int(a.get("status", "503"))
            delay = float(a.get("delay", "0"))
        except ValueError:
            return jsonify(error="bad_parameters"), 400
        error = a.get("error", "temporarily_unavailable")
        FAULTS.add(Fault(status, error, a.get("retry_after"), delay), count)
        return jsonify(queued=count)

    @app.post("/_test/dpop")
    def hook_dpop():
        a = request.args
        with DPoPState.lock:
            if "enable" in a:
                DPoPState.enabled = a["enable"] in ("1", "true")
            if a.get("nonce") in ("1", "true") and DPoPState.nonce is None or a.get("rotate_nonce") in ("1", "true"):
                DPoPState.nonce = secrets.token_urlsafe(16)
            if a.get("nonce") in ("0", "false"):
                DPoPState.nonce = None
            if "answer_bearer" in a:
                DPoPState.answer_bearer = a["answer_bearer"] in ("1", "true")
            return jsonify(enabled=DPoPState.enabled, nonce=DPoPState.nonce)

    @app.post("/_test/clock")
    def hook_clock():
        Clock.skew = int(request.args.get("skew", "0"))
        Clock.IAT_WINDOW = int(request.args.get("window", "60"))
        dpop_common.IAT_WINDOW = Clock.IAT_WINDOW
        return jsonify(skew=Clock.skew, window=Clock.IAT_WINDOW)

    @app.get("/_test/dpop-stats")
    def hook_dpop_stats():
        with DPoPState.lock:
            return jsonify(proofs=DPoPState.proofs, nonce_demands=DPoPState.nonce_demands, bound=DPoPState.bound,
                           failures=list(DPoPState.failures))

    @app.post("/_test/clear-faults")
    def hook_clear_faults():
        FAULTS.clear()
        return jsonify(ok=True)

    @app.post("/_test/configure")
    def hook_configure():
        a = request.args
        try:
            if "token_lifetime" in a:
                Config.token_lifetime = int(a["token_lifetime"])
            if "grace_seconds" in a:
                Config.grace_seconds = int(a["grace_seconds"])
            if "rotate_refresh_tokens" in a:
                Config.rotate_refresh_tokens = a["rotate_refresh_tokens"] in ("1", "true", "yes")
        except ValueError:
            return jsonify(error="bad_parameters"), 400
        return jsonify(
            token_lifetime=Config.token_lifetime,
            grace_seconds=Config.grace_seconds,
            rotate_refresh_tokens=Config.rotate_refresh_tokens,
        )

    @app.post("/_test/issue-refresh-token")
    def hook_issue_refresh_token():
        cid = request.args.get("client_id", "cli")
        user = request.args.get("user", "alice")
        scope = request.args.get("scope", DEFAULT_SCOPE)
        client = CLIENTS.get(cid)
        if client is None or not client.check_grant_type("refresh_token"):
            return jsonify(error="unknown_client_or_no_refresh_grant", client_id=cid), 400
        if user not in USERS:
            return jsonify(error="unknown_user", user=user), 400
        rt = secrets.token_urlsafe(32)
        STORE.add(Token(cid, user, scope, None, rt, 0))
        return jsonify(refresh_token=rt, client_id=cid, user=user, scope=scope)

    return app


def main(argv=None):
    p = argparse.ArgumentParser(description="OAuth 2.0 test authorization server (Authlib)")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--port-file", default=None)
    p.add_argument("--token-lifetime", type=int, default=3600)
    p.add_argument("--rotate-refresh-tokens", action="store_true")
    p.add_argument("--grace-seconds", type=int, default=10)
    p.add_argument("--trailing-slash", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="exit when this process is no longer our parent (a crashed test run leaves no server behind)",
    )
    args = p.parse_args(argv)

    # A parent that blocks SIGTERM (e.g. a test runner's thread) passes the mask on through
    # posix_spawn; unblock it so `terminate()` works, and exit at once on it.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))

    if args.parent_pid is not None:

        def watch_parent():
            while os.getppid() == args.parent_pid:
                time.sleep(0.5)
            os._exit(0)

        threading.Thread(target=watch_parent, daemon=True).start()

    Config.token_lifetime = args.token_lifetime
    Config.rotate_refresh_tokens = args.rotate_refresh_tokens
    Config.grace_seconds = args.grace_seconds
    Config.trailing_slash = args.trailing_slash

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, stream=sys.stderr)
    if not args.verbose:
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # Authlib refuses plain HTTP token endpoints unless told this is a test.
    os.environ["AUTHLIB_INSECURE_TRANSPORT"] = "1"

    app = create_app()
    srv = make_server("127.0.0.1", args.port, app, threaded=True, request_handler=SkewedDateRequestHandler)
    port = srv.server_port  # listening already: make_server binds and listens
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{port}\n")
        os.replace(tmp, args.port_file)
    print(f"oauth_server listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
