#ifndef BEARERD_CNGHTTP2_H
#define BEARERD_CNGHTTP2_H
#include <nghttp2/nghttp2.h>
#endif
