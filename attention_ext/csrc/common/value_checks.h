// The one process-wide setting of the kernels (its own header, with nothing but <atomic>, so that
// module.cpp stays free of ATen's big headers).
#pragma once

#include <atomic>

namespace attention_ext_checks {

// Whether CUDA operators read their device-side value checks back on the host (lsh_cuda.cu's
// flag of bad lengths or order): a synchronisation per call. On by default; Python's
// attention_ext.set_input_validation sets it (module.cpp), so that a GPU training loop with
// validation off never waits for the device. One instance for the whole library (an inline
// function's static).
inline std::atomic<bool>& device_value_checks() {
  static std::atomic<bool> enabled{true};
  return enabled;
}

}  // namespace attention_ext_checks
