#ifndef BEARERD_TLS_SHIM_H
#define BEARERD_TLS_SHIM_H
/* TLS-engine additions to the shim (kept apart from bearerd_shim.h to keep merges simple).
   Functions for OpenSSL macros Swift cannot import. Prefixed `bearerd_`. */
#include <openssl/ssl.h>
#include <openssl/x509.h>

/* X509_NAME_print_ex flags for an RFC 2253 string ("CN=client,O=example"). */
unsigned long bearerd_XN_FLAG_RFC2253(void);
/* SSL_CTX_set_max_proto_version is a macro; tests use it to pin TLS 1.2. */
long bearerd_SSL_CTX_set_max_proto_version(SSL_CTX *ctx, int version);
int bearerd_TLS1_3_VERSION(void);
/* SSL_CTX_get_min_proto_version is a macro. */
int bearerd_SSL_CTX_get_min_proto_version(SSL_CTX *ctx);
/* Client session resumption (docs/architecture.md §2.3): SSL_CTX_set_session_cache_mode is a
   macro; the app-data slot carries the engine to the new-session callback. */
long bearerd_SSL_CTX_set_client_session_cache(SSL_CTX *ctx);
int bearerd_SSL_set_app_data(SSL *ssl, void *data);
void *bearerd_SSL_get_app_data(const SSL *ssl);

#endif
