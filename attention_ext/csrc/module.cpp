// The Python module attention_ext._C. Importing it loads this shared library, whose
// static TORCH_LIBRARY_FRAGMENT blocks (one per kernel family, one file each)
// register the operators under torch.ops.attention_ext.*. Keeping registration in
// the torch dispatcher lets CUDA files add TORCH_LIBRARY_IMPL(attention_ext, CUDA, m)
// for the same operators.
//
// Only pybind11 and ATen's threading header: torch/extension.h would pull in all of torch's C++
// API (nn, optim, autograd, serialisation) and its Python bindings, for one function that needs
// none of them; with it this file and lsh.cpp were the slowest of the build.
#include "common/value_checks.h"

#include <ATen/Parallel.h>
#include <pybind11/pybind11.h>

#include <atomic>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "compiled kernels of attention_ext (operators live in torch.ops.attention_ext)";
  // The threads at::parallel_for really runs on in this extension. Its header falls back to
  // a serial loop when the extension is compiled without OpenMP, however many threads torch
  // has; this lets a test (and a user) see which build they have.
  m.def("parallel_for_threads", [] {
    const int64_t threads = at::get_num_threads();
    std::atomic<int64_t> seen{0};
    at::parallel_for(0, threads, 1, [&](int64_t, int64_t) { seen.fetch_add(1); });
    return seen.load();
  }, "number of threads an at::parallel_for over torch.get_num_threads() tasks runs on");
  // Not an operator: a process-wide setting, like torch's own switches (no tensor, no trace).
  m.def("set_device_value_checks", [](bool enabled) { attention_ext_checks::device_value_checks().store(enabled); },
        "whether CUDA operators read their value checks on the host (attention_ext.set_input_validation)");
}
