#ifndef SWITCHBOARD_CLIBUV_SHIM_H
#define SWITCHBOARD_CLIBUV_SHIM_H
#include <uv.h>
#endif
