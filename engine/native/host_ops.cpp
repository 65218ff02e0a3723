// engine._C: the engine's host-side hot paths. Each function has a pure Python twin in
// engine/native/python_ops.py that returns identical results; keep the two in step and bump
// API_VERSION in both places when a signature or a result changes.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

constexpr int64_t API_VERSION = 1;

// Bad input raises ValueError, like the Python twin (pybind11's own exception type crosses
// into Python the same way under every torch build).
inline void check(bool ok, const std::string& message) {
  if (!ok) throw py::value_error(message);
}

// splitmix64's finalizer: a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t block_hash(uint64_t parent, const int64_t* tokens, int64_t n) {
  uint64_t h = mix64(parent ^ static_cast<uint64_t>(n));
  for (int64_t i = 0; i < n; ++i) h = mix64(h ^ static_cast<uint64_t>(tokens[i]));
  return h;
}

// Chained hashes of the full blocks of `tokens`, the first chained to `parent`.
std::vector<uint64_t> block_hashes(const std::vector<int64_t>& tokens, int64_t block_size, uint64_t parent) {
  check(block_size > 0, "block_hashes: block_size must be positive, got " + std::to_string(block_size));
  std::vector<uint64_t> out;
  const int64_t full = static_cast<int64_t>(tokens.size()) / block_size;
  out.reserve(full);
  uint64_t h = parent;
  for (int64_t b = 0; b < full; ++b) {
    h = block_hash(h, tokens.data() + b * block_size, block_size);
    out.push_back(h);
  }
  return out;
}

inline int64_t slot_of(const std::vector<int64_t>& table, int64_t pos, int64_t block_size) {
  const int64_t idx = pos / block_size;
  check(idx < static_cast<int64_t>(table.size()),
        "position " + std::to_string(pos) + " has no block in a table of " + std::to_string(table.size()));
  return table[idx] * block_size + pos % block_size;
}

// Prefill metadata; see engine/native/python_ops.py:pack_prefill for the contract.
std::vector<at::Tensor> pack_prefill(const std::vector<std::vector<int64_t>>& tokens,
                                        const std::vector<int64_t>& num_cached,
                                        const std::vector<std::vector<int64_t>>& block_tables, int64_t block_size) {
  const int64_t b = static_cast<int64_t>(tokens.size());
  check(static_cast<int64_t>(num_cached.size()) == b && static_cast<int64_t>(block_tables.size()) == b,
        "pack_prefill: tokens, num_cached and block_tables must have one entry per sequence");
  int64_t total_q = 0, total_k = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = static_cast<int64_t>(tokens[i].size());
    check(num_cached[i] >= 0 && num_cached[i] < n,
          "pack_prefill: sequence " + std::to_string(i) + " has " + std::to_string(num_cached[i]) + " cached of " +
              std::to_string(n) + " tokens; at least one must be computed");
    total_q += n - num_cached[i];
    total_k += n;
  }
  auto i64 = at::TensorOptions().dtype(at::kLong);
  auto i32 = at::TensorOptions().dtype(at::kInt);
  at::Tensor input_ids = at::empty({total_q}, i64), positions = at::empty({total_q}, i64);
  at::Tensor slots = at::empty({total_q}, i64), context_slots = at::empty({total_k}, i64);
  at::Tensor cu_q = at::empty({b + 1}, i32), cu_k = at::empty({b + 1}, i32), last = at::empty({b}, i64);
  int64_t *ids_p = input_ids.data_ptr<int64_t>(), *pos_p = positions.data_ptr<int64_t>();
  int64_t *slot_p = slots.data_ptr<int64_t>(), *ctx_p = context_slots.data_ptr<int64_t>(), *last_p = last.data_ptr<int64_t>();
  int32_t *cu_q_p = cu_q.data_ptr<int32_t>(), *cu_k_p = cu_k.data_ptr<int32_t>();
  int64_t q = 0, k = 0;
  cu_q_p[0] = 0;
  cu_k_p[0] = 0;
  for (int64_t i = 0; i < b; ++i) {
    const int64_t n = static_cast<int64_t>(tokens[i].size());
    for (int64_t p = 0; p < n; ++p) {
      const int64_t slot = slot_of(block_tables[i], p, block_size);
      ctx_p[k++] = slot;
      if (p >= num_cached[i]) {
        ids_p[q] = tokens[i][p];
        pos_p[q] = p;
        slot_p[q] = slot;
        ++q;
      }
    }
    cu_q_p[i + 1] = static_cast<int32_t>(q);
    cu_k_p[i + 1] = static_cast<int32_t>(k);
    last_p[i] = q - 1;
  }
  return {input_ids, positions, slots, context_slots, cu_q, cu_k, last};
}

// Decode metadata; see engine/native/python_ops.py:pack_decode for the contract.
std::vector<at::Tensor> pack_decode(const std::vector<int64_t>& last_tokens, const std::vector<int64_t>& seq_lens,
                                       const std::vector<std::vector<int64_t>>& block_tables, int64_t block_size,
                                       int64_t width) {
  const int64_t b = static_cast<int64_t>(last_tokens.size());
  check(static_cast<int64_t>(seq_lens.size()) == b && static_cast<int64_t>(block_tables.size()) == b,
        "pack_decode: last_tokens, seq_lens and block_tables must have one entry per sequence");
  auto i64 = at::TensorOptions().dtype(at::kLong);
  auto i32 = at::TensorOptions().dtype(at::kInt);
  at::Tensor input_ids = at::empty({b}, i64), positions = at::empty({b}, i64), slots = at::empty({b}, i64);
  at::Tensor tables = at::zeros({b, width}, i32), lens = at::empty({b}, i32);
  int64_t *ids_p = input_ids.data_ptr<int64_t>(), *pos_p = positions.data_ptr<int64_t>(), *slot_p = slots.data_ptr<int64_t>();
  int32_t *tab_p = tables.data_ptr<int32_t>(), *len_p = lens.data_ptr<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    const auto& table = block_tables[i];
    check(static_cast<int64_t>(table.size()) <= width, "pack_decode: sequence " + std::to_string(i) + " has " +
                                                           std::to_string(table.size()) + " blocks, more than the width " +
                                                           std::to_string(width));
    check(seq_lens[i] >= 1, "pack_decode: sequence " + std::to_string(i) + " is empty");
    ids_p[i] = last_tokens[i];
    pos_p[i] = seq_lens[i] - 1;
    slot_p[i] = slot_of(table, seq_lens[i] - 1, block_size);
    len_p[i] = static_cast<int32_t>(seq_lens[i]);
    for (size_t j = 0; j < table.size(); ++j) tab_p[i * width + j] = static_cast<int32_t>(table[j]);
  }
  return {input_ids, positions, slots, tables, lens};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "engine host-side hot paths (block hashing, per-step batch metadata packing)";
  m.def("api_version", [] { return API_VERSION; });
  m.def("block_hashes", &block_hashes, "chained 64-bit hashes of the full blocks of a token list");
  m.def("pack_prefill", &pack_prefill, "prefill step metadata as CPU tensors");
  m.def("pack_decode", &pack_decode, "decode step metadata as CPU tensors");
}
