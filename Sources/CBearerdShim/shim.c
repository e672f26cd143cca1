#include "bearerd_shim.h"
#include <nghttp2/nghttp2.h>

long bearerd_SSL_set_tlsext_host_name(SSL *ssl, const char *name) { return SSL_set_tlsext_host_name(ssl, name); }
long bearerd_BIO_set_mem_eof_return(BIO *bio, long v) { return BIO_set_mem_eof_return(bio, v); }
long bearerd_BIO_get_mem_pending(BIO *bio) { return (long)BIO_ctrl_pending(bio); }
long bearerd_SSL_CTX_set_mode(SSL_CTX *ctx, long mode) { return SSL_CTX_set_mode(ctx, mode); }
long bearerd_SSL_CTX_set_min_proto_version(SSL_CTX *ctx, int version) { return SSL_CTX_set_min_proto_version(ctx, version); }
int bearerd_TLS1_2_VERSION(void) { return TLS1_2_VERSION; }
long bearerd_SSL_MODE_RELEASE_BUFFERS(void) { return SSL_MODE_RELEASE_BUFFERS; }
long bearerd_SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER(void) { return SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER; }
long bearerd_SSL_MODE_ENABLE_PARTIAL_WRITE(void) { return SSL_MODE_ENABLE_PARTIAL_WRITE; }
const char *bearerd_nghttp2_version_string(void) {
    nghttp2_info *info = nghttp2_version(0);
    return info ? info->version_str : "unknown";
}
