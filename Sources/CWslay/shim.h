#ifndef SWITCHBOARD_CWSLAY_SHIM_H
#define SWITCHBOARD_CWSLAY_SHIM_H
#include <stddef.h>
#include <sys/types.h>
#include <wslay/wslay.h>
#endif
