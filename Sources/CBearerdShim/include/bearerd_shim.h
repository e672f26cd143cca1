#ifndef BEARERD_SHIM_H
#define BEARERD_SHIM_H
/* Functions for the OpenSSL and nghttp2 macros Swift cannot call. Prefixed `bearerd_`. */
#include <openssl/ssl.h>
#include <openssl/bio.h>
#include <stddef.h>
#include <sys/types.h>

long bearerd_SSL_set_tlsext_host_name(SSL *ssl, const char *name);
long bearerd_BIO_set_mem_eof_return(BIO *bio, long v);
long bearerd_BIO_get_mem_pending(BIO *bio);
long bearerd_SSL_CTX_set_mode(SSL_CTX *ctx, long mode);
long bearerd_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version);
int bearerd_TLS1_2_VERSION(void);
long bearerd_SSL_MODE_RELEASE_BUFFERS(void);
long bearerd_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER(void);
long bearerd_SSL_MODE_ENABLE_PARTIAL_WRITE(void);

/* Debian 12 ships nghttp2 1.52: the ssize_t-returning calls are used directly (the `*2`
   variants arrived in 1.60). This reports the runtime version for diagnostics. */
const char *bearerd_nghttp2_version_string(void);

#endif
