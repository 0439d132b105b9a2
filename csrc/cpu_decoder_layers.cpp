// A decode step's decoder layers in one call: the decoder stack's layer (model_paths/decoder_stack.py)
// for every layer, each projection by its linear method's kernel at the step's rows (gemv's or
// oneDNN's packed GEMM, torch's int4 one, ours of GGUF's blocks), attention by the paged kernel.
//
// It calls the same kernels as the Python loop, through the dispatcher, in the same order on tensors
// of the same shapes and strides, so the hidden state it leaves is the loop's bitwise. What it removes
// is the Python between the kernels (about 2 ms of a 13 ms SmolLM2 decode step at one row) and, in
// a served engine, the gaps in which torch's OpenMP workers stop spinning and fall asleep between
// two parallel regions (each then pays a wake-up).

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <string>

#ifndef TRITONLM_OPS  // another namespace only to load two builds side by side (A/B of variants)
#define TRITONLM_OPS tritonlm_cpu
#endif
#define TRITONLM_STR2(x) #x
#define TRITONLM_STR(x) TRITONLM_STR2(x)

namespace {

using Tensor = at::Tensor;
using Optional = std::optional<at::Tensor>;

template <typename Fn>
c10::TypedOperatorHandle<Fn> op(const std::string& qualified) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), "").typed<Fn>();
}

template <typename Fn>
c10::TypedOperatorHandle<Fn> op(const char* name) {
  return op<Fn>(std::string(TRITONLM_STR(TRITONLM_OPS)) + "::" + name);
}

using Linear = Tensor(const Tensor&, const Tensor&, const Optional&, std::string_view,
                      c10::List<std::optional<at::Scalar>>, std::optional<std::string_view>);

// The kernels this library registers (their schemas in the other sources).
struct Kernels {
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, const Optional&, int64_t)> gemv =
      op<Tensor(const Tensor&, const Tensor&, const Optional&, int64_t)>("gemv");
  c10::TypedOperatorHandle<void(Tensor&, const Tensor&, const Tensor&, bool)> rotary =
      op<void(Tensor&, const Tensor&, const Tensor&, bool)>("rotary");
  c10::TypedOperatorHandle<void(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                const Tensor&, int64_t, double, bool)>
      attention = op<void(Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, int64_t, double, bool)>("paged_attention");
  c10::TypedOperatorHandle<void(Tensor&, Tensor&, const Tensor&, const Tensor&, double, bool)> add_rms_norm =
      op<void(Tensor&, Tensor&, const Tensor&, const Tensor&, double, bool)>("add_rms_norm");
  c10::TypedOperatorHandle<void(Tensor&, const Tensor&, const Tensor&, bool)> silu_and_mul =
      op<void(Tensor&, const Tensor&, const Tensor&, bool)>("silu_and_mul");
  c10::TypedOperatorHandle<Tensor(const Tensor&, const Tensor&, int64_t, const Optional&, int64_t)> gguf_gemv =
      op<Tensor(const Tensor&, const Tensor&, int64_t, const Optional&, int64_t)>("gguf_gemv");
  // oneDNN's GEMM over a pre-packed weight (linear/onednn.py's call).
  c10::TypedOperatorHandle<Linear> onednn = op<Linear>(std::string("mkldnn::_linear_pointwise"));
};

// How a projection multiplies (model_paths/layers_call.py's KINDS), as its linear method does at a
// few rows.
enum Kind : int64_t { kGemv = 0, kInt4 = 1, kGguf = 2, kOneDnn = 3 };

struct Projections {
  at::TensorList weights;  // gemv: [N, K]; int4: torch's int4pack; GGUF: the file's blocks; oneDNN: packed
  const c10::List<Optional>& extras;  // int4: its scales and zeros
  at::ArrayRef<int64_t> kinds;
  at::ArrayRef<int64_t> args;  // int4: the group size; GGUF: the block type
  const c10::List<Optional>& biases;
  int64_t level;  // gemv's and the GGUF kernels' loop level

  Tensor operator()(const Kernels& k, const Tensor& x, int64_t i) const {
    switch (kinds[i]) {
      case kGemv: return k.gemv.call(x, weights[i], biases.get(i), level);
      case kGguf: return k.gguf_gemv.call(x, weights[i], args[i], biases.get(i), level);
      case kOneDnn: return k.onednn.call(x, weights[i], biases.get(i), "none", c10::List<std::optional<at::Scalar>>(), "");
      case kInt4: {
        Tensor out = at::_weight_int4pack_mm_for_cpu(x, weights[i], args[i], *extras.get(i));
        const Optional bias = biases.get(i);
        if (bias) out += *bias;  // after the product, as RowsProjection adds it
        return out;
      }
      default: TORCH_CHECK(false, "decoder_layers: unknown projection kind ", kinds[i]);
    }
  }
};

const Kernels& kernels() {
  static const Kernels k;  // looked up once, after every source registered its ops
  return k;
}

// x [rows, hidden] (the first layer's input norm applied) and residual [rows, hidden] (the stream)
// through every layer; x ends as the final norm's output, residual as the last layer's stream.
// Per layer l: projections 4l..4l+3 the q/k/v, o, gate/up and down ones (`Projections`); norms[2l], eps[2l] the post-attention norm, norms[2l+1], eps[2l+1] the next
// layer's input norm (the final norm after the last layer); key_pools[l], value_pools[l] its paged
// pools [slots, kv_heads, head_dim]; scales[l] its attention scale. cos, sin [rows, rotated] rotate
// the first `rotated` dimensions of each query and key head. slots, tables, row_seq, row_len: the
// step's PagedMetadata (worker/attention/paged.py).
void decoder_layers(Tensor& x, Tensor& residual, at::TensorList weights, const c10::List<Optional>& extras,
                    at::IntArrayRef kinds, at::IntArrayRef args, const c10::List<Optional>& biases, int64_t level,
                    at::TensorList norms, at::ArrayRef<double> eps, const Tensor& cos, const Tensor& sin,
                    at::TensorList key_pools, at::TensorList value_pools, const Tensor& slots, const Tensor& tables,
                    const Tensor& row_seq, const Tensor& row_len, int64_t block_size, at::ArrayRef<double> scales,
                    int64_t heads, int64_t kv_heads) {
  const int64_t layers = static_cast<int64_t>(key_pools.size());
  for (const int64_t n : {static_cast<int64_t>(weights.size()), static_cast<int64_t>(extras.size()),
                          static_cast<int64_t>(kinds.size()), static_cast<int64_t>(args.size()),
                          static_cast<int64_t>(biases.size())})
    TORCH_CHECK(n == 4 * layers, "decoder_layers: four projections a layer (weights, extras, kinds, args, biases)");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == 2 * layers && static_cast<int64_t>(eps.size()) == 2 * layers,
              "decoder_layers: two norms (and eps) a layer");
  TORCH_CHECK(static_cast<int64_t>(value_pools.size()) == layers && static_cast<int64_t>(scales.size()) == layers,
              "decoder_layers: a value pool and a scale a layer");
  const Kernels& k = kernels();
  const Projections project{weights, extras, kinds, args, biases, level};
  const int64_t rows = x.size(0), rotated = cos.size(1);
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t dim = key_pools[l].size(2);
    Tensor qkv = project(k, x, 4 * l).view({rows, heads + 2 * kv_heads, dim});
    Tensor turned = qkv.narrow(1, 0, heads + kv_heads).narrow(2, 0, rotated);
    k.rotary.call(turned, cos, sin, true);
    const Tensor query = qkv.narrow(1, 0, heads);
    key_pools[l].index_copy_(0, slots, qkv.narrow(1, heads, kv_heads));
    value_pools[l].index_copy_(0, slots, qkv.narrow(1, heads + kv_heads, kv_heads));
    Tensor attended = at::empty({rows, heads, dim}, x.options());
    k.attention.call(attended, query, key_pools[l], value_pools[l], tables, row_seq, row_len, block_size, scales[l],
                     true);
    const Tensor o = project(k, attended.view({rows, heads * dim}), 4 * l + 1);
    k.add_rms_norm.call(x, residual, o, norms[2 * l], eps[2 * l], true);
    const Tensor gate_up = project(k, x, 4 * l + 2);
    const int64_t width = gate_up.size(1) / 2;
    Tensor hidden = at::empty({rows, width}, x.options());
    k.silu_and_mul.call(hidden, gate_up.narrow(1, 0, width), gate_up.narrow(1, width, width), true);
    const Tensor down = project(k, hidden, 4 * l + 3);
    k.add_rms_norm.call(x, residual, down, norms[2 * l + 1], eps[2 * l + 1], true);
  }
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(TRITONLM_OPS, m) {
  m.def(
      "decoder_layers(Tensor(a!) x, Tensor(b!) residual, Tensor[] weights, Tensor?[] extras, int[] kinds, "
      "int[] args, Tensor?[] biases, int level, Tensor[] norms, float[] eps, Tensor cos, Tensor sin, "
      "Tensor(c!)[] key_pools, Tensor(d!)[] value_pools, Tensor slots, Tensor tables, Tensor row_seq, "
      "Tensor row_len, int block_size, float[] scales, int heads, int kv_heads) -> ()");
}

TORCH_LIBRARY_IMPL(TRITONLM_OPS, CPU, m) { m.impl("decoder_layers", decoder_layers); }
// oneDNN's packed weights are MkldnnCPU tensors, which then pick the op's kernel by that key.
TORCH_LIBRARY_IMPL(TRITONLM_OPS, MkldnnCPU, m) { m.impl("decoder_layers", decoder_layers); }
