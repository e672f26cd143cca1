#include "bearerd_jwk_shim.h"

int bearerd_EVP_PKEY_PUBLIC_KEY(void) { return EVP_PKEY_PUBLIC_KEY; }
