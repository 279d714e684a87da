#ifndef SWITCHBOARD_CHTTPPARSER_SHIM_H
#define SWITCHBOARD_CHTTPPARSER_SHIM_H
#include <http_parser.h>

// HTTP_PARSER_ERRNO is a macro.
static inline enum http_errno switchboard_http_errno(const http_parser *parser) { return HTTP_PARSER_ERRNO(parser); }
#endif
