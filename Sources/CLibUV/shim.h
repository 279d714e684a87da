#ifndef SWITCHBOARD_CLIBUV_SHIM_H
#define SWITCHBOARD_CLIBUV_SHIM_H
#include <uv.h>
#if defined(__linux__) && defined(__GLIBC__)
#include <malloc.h> /* mallopt, for MallocTuning */
#endif
#endif
