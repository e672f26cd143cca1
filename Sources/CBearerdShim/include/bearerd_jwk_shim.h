#ifndef BEARERD_JWK_SHIM_H
#define BEARERD_JWK_SHIM_H
/* Caller JWT verification (BearerdTLS/JWKVerifier.swift): the OpenSSL 3 headers for building a
   public key from a JWK's numbers, and the selection macro Swift cannot import. Prefixed `bearerd_`. */
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <openssl/rsa.h>

/* EVP_PKEY_PUBLIC_KEY (a macro of macros): EVP_PKEY_fromdata's selection for a public key. */
int bearerd_EVP_PKEY_PUBLIC_KEY(void);

#endif
