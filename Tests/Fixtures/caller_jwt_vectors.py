#!/usr/bin/env python3
"""Test vectors for bearerd's caller JWT validation (`caller_jwt`), signed by an independent
implementation: PyJWT on pyca/cryptography, with keys generated fresh on every run.

Prints one JSON object on stdout:

    {"now": <unix seconds>, "issuer": "...", "audience": "...", "leeway": 60,
     "jwks": {"keys": [...]},
     "vectors": [{"name": "...", "token": "...", "expect": "ok" | "caller_jwt.<reason>", "exp": <int|null>}]}

`expect` is the verdict bearerd must reach at `now` with that issuer, audience and leeway and
the key set `jwks`; the Swift test (CallerJWTVectorTests) checks every one. Every vector expected
to pass is also decoded with PyJWT here, and every forged one is refused by PyJWT where PyJWT
can express the check, so a wrong expectation fails in this script first.
"""
import base64
import hashlib
import hmac
import json
import sys
import time

import jwt
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa, utils
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm

ISSUER = "https://login.example.com"
AUDIENCE = "bearerd"
LEEWAY = 60
NOW = int(time.time())


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def claims(**over):
    c = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": NOW - 10, "exp": NOW + 600}
    for k, v in over.items():
        if v is None:
            c.pop(k, None)
        else:
            c[k] = v
    return c


def raw_jws(header: dict, payload: dict, sign) -> str:
    """A compact JWS built by hand (for what PyJWT refuses to produce); `sign(input) -> bytes`."""
    h = b64(json.dumps(header, separators=(",", ":")).encode())
    p = b64(json.dumps(payload, separators=(",", ":")).encode())
    signing_input = (h + "." + p).encode()
    return h + "." + p + "." + b64(sign(signing_input))


def main() -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa3072 = rsa.generate_private_key(public_exponent=65537, key_size=3072)
    p256 = ec.generate_private_key(ec.SECP256R1())
    p384 = ec.generate_private_key(ec.SECP384R1())
    ed = ed25519.Ed25519PrivateKey.generate()
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    rotated = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # not in the set
    stranger = ec.generate_private_key(ec.SECP256R1())                       # not in the set

    def jwk(alg_cls, key, kid, **extra):
        d = alg_cls.to_jwk(key.public_key(), as_dict=True)
        d["kid"] = kid
        d.update(extra)
        return d

    jwks = {"keys": [
        jwk(RSAAlgorithm, rsa_key, "rsa1", use="sig"),
        jwk(RSAAlgorithm, rsa3072, "rsa3072", alg="PS384"),
        jwk(ECAlgorithm, p256, "ec256", use="sig"),
        jwk(ECAlgorithm, p384, "ec384"),
        jwk(OKPAlgorithm, ed, "ed1"),
        jwk(RSAAlgorithm, weak, "weak"),                       # 1024 bits: skipped
        jwk(RSAAlgorithm, rotated, "enc1", use="enc"),         # not for signatures: skipped
        {"kty": "oct", "kid": "hmac1", "k": b64(b"0123456789abcdef0123456789abcdef")},  # symmetric: skipped
    ]}

    vectors = []

    def add(name, token, expect, exp=None):
        vectors.append({"name": name, "token": token, "expect": expect, "exp": exp})

    def sign(key, alg, kid, **over):
        c = claims(**over)
        headers = {"kid": kid} if kid is not None else {}
        return jwt.encode(c, key, algorithm=alg, headers=headers), c.get("exp")

    # Every algorithm bearerd verifies, signed by PyJWT.
    for alg, key, kid in [("RS256", rsa_key, "rsa1"), ("RS384", rsa_key, "rsa1"), ("RS512", rsa_key, "rsa1"),
                          ("PS256", rsa_key, "rsa1"), ("PS384", rsa3072, "rsa3072"), ("PS512", rsa_key, "rsa1"),
                          ("ES256", p256, "ec256"), ("ES384", p384, "ec384"), ("EdDSA", ed, "ed1")]:
        token, exp = sign(key, alg, kid)
        add(alg.lower(), token, "ok", exp)

    # Claims.
    token, exp = sign(rsa_key, "RS256", None)
    add("rs256 without kid: the only RSA key that accepts RS256", token, "ok", exp)
    token, exp = sign(p256, "ES256", "ec256", aud=["other", AUDIENCE])
    add("aud array containing the audience", token, "ok", exp)
    token, exp = sign(p256, "ES256", "ec256", exp=NOW - 30)
    add("expired 30 s ago, within the leeway", token, "ok", exp)
    token, exp = sign(ed, "EdDSA", "ed1", nbf=NOW + 30)
    add("nbf 30 s ahead, within the leeway", token, "ok", exp)
    add("expired 120 s ago", sign(p256, "ES256", "ec256", exp=NOW - 120)[0], "caller_jwt.expired")
    add("no exp", sign(rsa_key, "RS256", "rsa1", exp=None)[0], "caller_jwt.expired")
    add("nbf 300 s ahead", sign(ed, "EdDSA", "ed1", nbf=NOW + 300)[0], "caller_jwt.not_yet_valid")
    add("iat 300 s ahead", sign(rsa_key, "PS256", "rsa1", iat=NOW + 300)[0], "caller_jwt.not_yet_valid")
    add("wrong iss", sign(rsa_key, "RS256", "rsa1", iss="https://evil.example.com")[0], "caller_jwt.wrong_issuer")
    add("iss with a trailing slash", sign(rsa_key, "RS256", "rsa1", iss=ISSUER + "/")[0], "caller_jwt.wrong_issuer")
    add("wrong aud", sign(p384, "ES384", "ec384", aud="someone-else")[0], "caller_jwt.wrong_audience")
    add("aud array without the audience", sign(p384, "ES384", "ec384", aud=["a", "b"])[0], "caller_jwt.wrong_audience")
    add("no aud", sign(p384, "ES384", "ec384", aud=None)[0], "caller_jwt.wrong_audience")

    # Forgeries.
    good = sign(rsa_key, "RS256", "rsa1")[0]
    h, p, s = good.split(".")
    forged_claims = b64(json.dumps(claims(sub="mallory"), separators=(",", ":")).encode())
    add("claims replaced, signature kept", h + "." + forged_claims + "." + s, "caller_jwt.bad_signature")
    sig = bytearray(unb64(s)); sig[10] ^= 1
    add("rs256 signature with one bit flipped", h + "." + p + "." + b64(bytes(sig)), "caller_jwt.bad_signature")
    for alg, key, kid in [("ES256", p256, "ec256"), ("EdDSA", ed, "ed1"), ("PS256", rsa_key, "rsa1")]:
        h2, p2, s2 = sign(key, alg, kid)[0].split(".")
        sig = bytearray(unb64(s2)); sig[-1] ^= 0x80
        add(alg.lower() + " signature with one bit flipped", h2 + "." + p2 + "." + b64(bytes(sig)), "caller_jwt.bad_signature")
    # A PSS signature presented as RS256 (same key, same hash, other padding).
    h3, p3, s3 = sign(rsa_key, "PS256", "rsa1")[0].split(".")
    rs_header = b64(json.dumps({"alg": "RS256", "kid": "rsa1", "typ": "JWT"}, separators=(",", ":")).encode())
    add("ps256 signature under an rs256 header", rs_header + "." + p3 + "." + s3, "caller_jwt.bad_signature")
    # RFC 7518 §3.5: the PSS salt is as long as the hash; a maximal salt is another signature scheme.
    long_salt = raw_jws({"alg": "PS256", "kid": "rsa1"}, claims(), lambda m: rsa_key.sign(
        m, padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.MAX_LENGTH), hashes.SHA256()))
    add("ps256 with a maximal salt", long_salt, "caller_jwt.bad_signature")
    # An ES256 signature in DER instead of JOSE's r || s.
    der_token = raw_jws({"alg": "ES256", "kid": "ec256"}, claims(),
                        lambda m: p256.sign(m, ec.ECDSA(hashes.SHA256())))
    add("es256 signature in DER form", der_token, "caller_jwt.bad_signature")
    # Signed by a key outside the set, under a kid the set does not have, and under one it has.
    add("kid not in the set", sign(rotated, "RS256", "rotated")[0], "caller_jwt.unknown_key")
    add("another key under a known kid", sign(rotated, "RS256", "rsa1")[0], "caller_jwt.bad_signature")
    add("ES256 signed by a stranger under the RSA key's kid", sign(stranger, "ES256", "rsa1")[0], "caller_jwt.unknown_key")
    add("RS256 under the EC key's kid", sign(rsa_key, "RS256", "ec256")[0], "caller_jwt.unknown_key")
    add("PS256 under a key whose own alg is PS384", sign(rsa3072, "PS256", "rsa3072")[0], "caller_jwt.unknown_key")
    add("signed by the skipped 1024-bit key", sign(weak, "RS256", "weak")[0], "caller_jwt.unknown_key")
    add("signed by the skipped use:enc key", sign(rotated, "RS256", "enc1")[0], "caller_jwt.unknown_key")

    # Algorithms that must never be accepted.
    add("alg none", raw_jws({"alg": "none"}, claims(), lambda m: b""), "caller_jwt.unsupported_algorithm")
    add("alg none with a signature", raw_jws({"alg": "none", "kid": "rsa1"}, claims(), lambda m: b"x"), "caller_jwt.unsupported_algorithm")
    add("alg NONE", raw_jws({"alg": "NONE"}, claims(), lambda m: b"x"), "caller_jwt.unsupported_algorithm")
    pem = rsa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    add("HS256 keyed with the RSA public key PEM (algorithm confusion)",
        raw_jws({"alg": "HS256", "kid": "rsa1"}, claims(), lambda m: hmac.new(pem, m, hashlib.sha256).digest()),
        "caller_jwt.unsupported_algorithm")
    add("HS256 keyed with the symmetric JWK",
        raw_jws({"alg": "HS256", "kid": "hmac1"}, claims(), lambda m: hmac.new(b"0123456789abcdef0123456789abcdef", m, hashlib.sha256).digest()),
        "caller_jwt.unsupported_algorithm")
    add("ES512", raw_jws({"alg": "ES512", "kid": "ec256"}, claims(), lambda m: b"\x01" * 132), "caller_jwt.unsupported_algorithm")

    # Malformed.
    add("crit header", raw_jws({"alg": "RS256", "kid": "rsa1", "crit": ["exp"], "exp": 1},
                               claims(), lambda m: rsa_key.sign(m, padding.PKCS1v15(), hashes.SHA256())), "caller_jwt.malformed")
    add("padded base64url", good.split(".")[0] + "=." + ".".join(good.split(".")[1:]), "caller_jwt.malformed")
    add("standard base64 characters", h + "." + p + "." + s[:-2] + "+/", "caller_jwt.malformed")
    add("two parts", ".".join(good.split(".")[:2]), "caller_jwt.malformed")
    add("five parts (JWE)", good + ".a.b", "caller_jwt.malformed")
    add("claims not an object", h + "." + b64(b"[1,2]") + "." + s, "caller_jwt.malformed")
    add("empty signature", h + "." + p + ".", "caller_jwt.malformed")
    add("exp is a string", raw_jws({"alg": "RS256", "kid": "rsa1"}, claims(exp=str(NOW + 600)),
                                   lambda m: rsa_key.sign(m, padding.PKCS1v15(), hashes.SHA256())), "caller_jwt.malformed")

    # The script's own check: PyJWT accepts exactly the vectors expected to pass (those it can judge).
    keys_by_kid = {"rsa1": rsa_key, "rsa3072": rsa3072, "ec256": p256, "ec384": p384, "ed1": ed}
    for v in vectors:
        if v["expect"] != "ok":
            continue
        header = jwt.get_unverified_header(v["token"])
        key = keys_by_kid[header.get("kid", "rsa1")].public_key()
        jwt.decode(v["token"], key, algorithms=[header["alg"]], audience=AUDIENCE, issuer=ISSUER, leeway=LEEWAY,
                   options={"require": ["exp"]})
    for v in vectors:
        if v["expect"] in ("caller_jwt.bad_signature", "caller_jwt.expired", "caller_jwt.wrong_issuer",
                           "caller_jwt.wrong_audience", "caller_jwt.not_yet_valid"):
            try:
                header = jwt.get_unverified_header(v["token"])
                key = keys_by_kid.get(header.get("kid"), rsa_key).public_key()
                jwt.decode(v["token"], key, algorithms=[header["alg"]], audience=AUDIENCE, issuer=ISSUER,
                           leeway=LEEWAY, options={"require": ["exp"]})
            except jwt.PyJWTError:
                continue
            if v["name"] == "iat 300 s ahead":
                continue  # PyJWT does not judge iat in the future; bearerd does (RFC 7519 §4.1.6 + leeway)
            sys.exit("PyJWT accepted a vector expected to fail: " + v["name"])

    json.dump({"now": NOW, "issuer": ISSUER, "audience": AUDIENCE, "leeway": LEEWAY, "jwks": jwks, "vectors": vectors},
              sys.stdout)


if __name__ == "__main__":
    main()
