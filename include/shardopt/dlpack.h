/* shardopt/dlpack.h — DLPack >= 1.0 for the C ABI: the vendored header, or the caller's own if included first. */
#ifndef SHARDOPT_DLPACK_H_
#define SHARDOPT_DLPACK_H_

/* Installed as <prefix>/include/shardopt/dlpack/dlpack.h, which this quoted include finds first
 * (next to this file); in the build tree it comes from third_party/dlpack/include. A dlpack.h the
 * caller included earlier wins through its include guard, so it must be new enough. */
#include "dlpack/dlpack.h"

#if !defined(DLPACK_MAJOR_VERSION) || DLPACK_MAJOR_VERSION < 1
#error "shardopt needs DLPack >= 1.0 (DLManagedTensorVersioned); an older dlpack.h was included before shardopt.h"
#endif

#endif /* SHARDOPT_DLPACK_H_ */
