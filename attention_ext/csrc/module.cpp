// The Python module attention_ext._C. Importing it loads this shared library, whose
// static TORCH_LIBRARY_FRAGMENT blocks (one per kernel family, one file each)
// register the operators under torch.ops.attention_ext.*. Keeping registration in
// the torch dispatcher lets CUDA files add TORCH_LIBRARY_IMPL(attention_ext, CUDA, m)
// for the same operators.
#include <torch/extension.h>

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "compiled kernels of attention_ext (operators live in torch.ops.attention_ext)";
}
