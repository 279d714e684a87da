#ifndef SWITCHBOARD_COPENSSL_SHIM_H
#define SWITCHBOARD_COPENSSL_SHIM_H
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

// OpenSSL spells these as function-like macros, which Swift cannot call.

static inline int switchboard_SSL_CTX_set_min_tls12(SSL_CTX *ctx) {
    return (int)SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
}

static inline void switchboard_SSL_CTX_set_safe_options(SSL_CTX *ctx) {
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
    SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
}

static inline int switchboard_SSL_set_server_name(SSL *ssl, const char *name) {
    return (int)SSL_set_tlsext_host_name(ssl, name);
}

static inline unsigned long switchboard_XN_FLAG_RFC2253(void) { return XN_FLAG_RFC2253; }

/// The flags a BIO sets when a read has nothing yet and should be retried.
static inline int switchboard_BIO_FLAGS_RETRY_READ(void) { return BIO_FLAGS_READ | BIO_FLAGS_SHOULD_RETRY; }

static inline const char *switchboard_SSL_version_name(const SSL *ssl) { return SSL_get_version(ssl); }
#endif
