#include "bearerd_tls_shim.h"

unsigned long bearerd_XN_FLAG_RFC2253(void) { return XN_FLAG_RFC2253; }
long bearerd_SSL_CTX_set_max_proto_version(SSL_CTX *ctx, int version) { return SSL_CTX_set_max_proto_version(ctx, version); }
int bearerd_TLS1_3_VERSION(void) { return TLS1_3_VERSION; }
int bearerd_SSL_CTX_get_min_proto_version(SSL_CTX *ctx) { return (int)SSL_CTX_get_min_proto_version(ctx); }
