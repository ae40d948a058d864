/* A plugin that exports the CPU backend: CMake builds it as libdataplane_cpu_plugin.so so the
 * tests drive the real loading path (dlopen, dp_plugin_init, the ABI check) and run the
 * backend conformance suite through it. */
#include "dp_backend.h"

__attribute__((visibility("default"))) const dp_backend *dp_plugin_init(void) { return dp_cpu_backend(); }
