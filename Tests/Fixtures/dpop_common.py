"""RFC 9449 (DPoP) proof checks shared by the test fixtures (oauth_server.py's token endpoint,
dpop_origin.py, grpc_echo.py --dpop). TEST FIXTURE ONLY. Verified with joserfc (Authlib's JOSE
library): the signature with the proof's own embedded public JWK, `typ`, `alg`, `htm`, `htu`,
`iat` window, `jti` uniqueness, `ath` and `nonce`.

Access tokens bound to a key (RFC 9449 §6.1) are JWTs signed HS256 with TOKEN_SECRET (shared by
the fixtures only) carrying `cnf.jkt`, so a separate resource server can check the binding.
"""

import base64
import hashlib
import json
import threading
import time

from joserfc import jws, jwt
from joserfc.jwk import OctKey, import_key

TOKEN_SECRET = OctKey.import_key(b"bearerd-dpop-fixture-token-secret-0123456789")
ALGORITHMS = ["ES256", "RS256", "PS256"]
IAT_WINDOW = 60


def _registry(algorithms):
    """joserfc's JWS registry with room for an RSA key's JWK in the header (RFC 9449 §4.2): its
    default 512-byte header limit refuses RSA 2048 proofs."""
    registry = jws.JWSRegistry(algorithms=algorithms)
    registry.max_header_length = 4096
    return registry


class ProofError(Exception):
    """`error` is the RFC 9449 error code, `description` says what failed."""

    def __init__(self, error, description):
        super().__init__(description)
        self.error = error
        self.description = description


class JtiCache:
    def __init__(self):
        self.lock = threading.Lock()
        self.seen = set()

    def add(self, jti):
        with self.lock:
            if jti in self.seen:
                return False
            self.seen.add(jti)
            return True


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def verify_proof(proof, htm, htu, jtis, access_token=None, nonce=None, now=None):
    """Returns (claims, jkt) or raises ProofError. `nonce`: the value the proof must carry
    (use_dpop_nonce when it differs or is absent). `now`: the verifier's clock (default: this
    host's), against which `iat` must be within IAT_WINDOW."""
    if not proof or proof.count(".") != 2:
        raise ProofError("invalid_dpop_proof", "no DPoP proof")
    try:
        header = jws.extract_compact(proof.encode(), registry=_registry(ALGORITHMS)).headers()
    except Exception as e:  # noqa: BLE001 a fixture reports any parse failure
        raise ProofError("invalid_dpop_proof", "unparsable proof: %s" % e)
    if header.get("typ") != "dpop+jwt":
        raise ProofError("invalid_dpop_proof", "typ is %r" % header.get("typ"))
    if header.get("alg") not in ALGORITHMS:
        raise ProofError("invalid_dpop_proof", "alg %r" % header.get("alg"))
    jwk = header.get("jwk")
    if not isinstance(jwk, dict) or any(k in jwk for k in ("d", "p", "q", "dp", "dq", "qi")):
        raise ProofError("invalid_dpop_proof", "jwk missing or holds private members")
    key = import_key(jwk)
    try:
        obj = jws.deserialize_compact(proof, key, registry=_registry([header["alg"]]))
    except Exception as e:  # noqa: BLE001
        raise ProofError("invalid_dpop_proof", "bad signature: %s" % e)
    claims = json.loads(obj.payload)
    if claims.get("htm") != htm:
        raise ProofError("invalid_dpop_proof", "htm %r, expected %r" % (claims.get("htm"), htm))
    if claims.get("htu") != htu:
        raise ProofError("invalid_dpop_proof", "htu %r, expected %r" % (claims.get("htu"), htu))
    iat = claims.get("iat")
    now = time.time() if now is None else now
    if not isinstance(iat, int) or abs(now - iat) > IAT_WINDOW:
        raise ProofError("invalid_dpop_proof", "iat %r outside the time window of the server's clock (%d)" % (iat, now))
    jti = claims.get("jti")
    if not isinstance(jti, str) or not jti:
        raise ProofError("invalid_dpop_proof", "no jti")
    if access_token is not None:
        expected = b64url(hashlib.sha256(access_token.encode()).digest())
        if claims.get("ath") != expected:
            raise ProofError("invalid_dpop_proof", "ath does not match the access token")
    elif "ath" in claims:
        raise ProofError("invalid_dpop_proof", "ath on a token request")
    if nonce is not None and claims.get("nonce") != nonce:
        raise ProofError("use_dpop_nonce", "nonce %r, expected the current one" % claims.get("nonce"))
    # jti last: a proof refused for its nonce may not be sent again anyway (a new one must be).
    if not jtis.add(jti):
        raise ProofError("invalid_dpop_proof", "jti reused")
    return claims, key.thumbprint()


def bound_token(client_id, jkt, lifetime):
    """A JWT access token bound to `jkt` (RFC 9449 §6.1)."""
    now = int(time.time())
    claims = {"client_id": client_id, "cnf": {"jkt": jkt}, "iat": now, "exp": now + max(lifetime, 60),
              "jti": b64url(hashlib.sha256(str(time.time_ns()).encode() + jkt.encode()).digest())[:22]}
    return jwt.encode({"alg": "HS256", "typ": "at+jwt"}, claims, TOKEN_SECRET)


def token_binding(token):
    """The `cnf.jkt` of a token from bound_token, or None when it is not one (or expired)."""
    try:
        claims = jwt.decode(token, TOKEN_SECRET, algorithms=["HS256"]).claims
    except Exception:  # noqa: BLE001
        return None
    if claims.get("exp", 0) < time.time():
        return None
    return (claims.get("cnf") or {}).get("jkt")
