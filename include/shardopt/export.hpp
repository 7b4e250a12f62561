// shardopt/export.hpp — SHARDOPT_API marks what libshardopt exports; everything else in it is hidden (built with -fvisibility=hidden).
#pragma once

// On a declaration of a function or class of the public C++ API. Classes carry it as a whole
// (their vtables and typeinfo must be shared, so that exceptions and dynamic_cast work across
// the library boundary). The C ABI has its own, C-compatible SHARDOPT_C_API in shardopt.h.
// A new non-inline public function or class without it links inside the library but not in
// its users ("undefined reference"); the test capi_exports lists what is exported.
#if defined(_WIN32)
#define SHARDOPT_API
#else
#define SHARDOPT_API __attribute__((visibility("default")))
#endif
