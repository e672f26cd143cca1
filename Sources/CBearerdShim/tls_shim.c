#include "bearerd_tls_shim.h"

unsigned long bearerd_XN_FLAG_RFC2253(void) { return XN_FLAG_RFC2253; }
long bearerd_SSL_CTX_set_max_proto_version(SSL_CTX *ctx, int version) { return SSL_CTX_set_max_proto_version(ctx, version); }
int bearerd_TLS1_3_VERSION(void) { return TLS1_3_VERSION; }
int bearerd_SSL_CTX_get_min_proto_version(SSL_CTX *ctx) { return (int)SSL_CTX_get_min_proto_version(ctx); }
long bearerd_SSL_CTX_set_client_session_cache(SSL_CTX *ctx) {
    return SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
}
int bearerd_SSL_set_app_data(SSL *ssl, void *data) { return SSL_set_app_data(ssl, data); }
void *bearerd_SSL_get_app_data(const SSL *ssl) { return SSL_get_app_data(ssl); }
