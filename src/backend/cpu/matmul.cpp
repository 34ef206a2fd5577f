// matmul(): checks the weight descriptor, then hands over to the variant of the active ISA.
// dequantize_row(): one row to floats through the common sub-block view.
#include "backend/cpu/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed_weights.h"
#include "backend/cpu/quant_blocks.h"
#include "backend/cpu/quant_kernels.h"
#include "backend/cpu/thread_pool.h"
#include "util/check.h"

namespace specdec {
namespace detail {

ScratchBuffer::~ScratchBuffer() {
  std::free(data_);
}

void* ScratchBuffer::get(size_t bytes) {
  if (bytes > capacity_) {
    std::free(data_);
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    data_ = std::aligned_alloc(64, rounded);
    if (data_ == nullptr) {
      capacity_ = 0;
      throw std::bad_alloc();
    }
    capacity_ = rounded;
  }
  return data_;
}

ScratchBuffer& thread_scratch(ScratchSlot slot) {
  thread_local ScratchBuffer buffers[kNumSlots];
  return buffers[slot];
}

}  // namespace detail

namespace {

void validate(const WeightMatrix& w, int64_t n, const char* where) {
  const GgmlTypeTraits* t = ggml_type_traits(static_cast<uint32_t>(w.type));
  if (t == nullptr || !t->weight_supported) {
    throw Error(std::string(where) + ": weight type " +
                ggml_type_name(static_cast<uint32_t>(w.type)) + " is not supported");
  }
  if (w.rows < 0 || w.cols <= 0 || w.cols % t->block_size != 0) {
    throw Error(std::string(where) + ": bad " + t->name + " weight shape " +
                std::to_string(w.rows) + "x" + std::to_string(w.cols) +
                " (cols must be a positive multiple of " + std::to_string(t->block_size) + ")");
  }
  if (w.row_bytes != ggml_row_bytes(w.type, w.cols)) {
    throw Error(std::string(where) + ": row_bytes " + std::to_string(w.row_bytes) + " of a " +
                t->name + " row of " + std::to_string(w.cols) + " elements should be " +
                std::to_string(ggml_row_bytes(w.type, w.cols)));
  }
  if (w.data == nullptr && w.packed == nullptr && w.rows > 0) {
    throw Error(std::string(where) + ": weight data is null");
  }
  if (w.packed != nullptr && w.packed_block_bytes != packed_block_bytes(w.type, w.cols)) {
    throw Error(std::string(where) + ": packed " + t->name + " matrix has a bad block size");
  }
  if (n < 0) throw Error(std::string(where) + ": negative n " + std::to_string(n));
}

}  // namespace

void matmul_isa(Isa isa, const WeightMatrix& w, const float* x, int64_t n, float* y,
                ThreadPool* pool) {
  validate(w, n, "matmul");
  if (n == 0 || w.rows == 0) return;
  if (x == nullptr || y == nullptr) throw Error("matmul: null activations or output");
  if (isa == Isa::kAvx512 && w.packed != nullptr) {
    SPECDEC_CHECK(isa_supported(Isa::kAvx512), "matmul_isa: AVX-512 not supported here");
    if (n < detail::kPackedPanelMinRows) {
      detail::packed_matmul_avx512(w, x, n, y, pool);
    } else {
      detail::matmul_avx512(w, x, n, y, pool);  // prefill: panels built from the packed rows
    }
    return;
  }
  // AVX2: the packed kernel below kPackedPanelMinRows rows (and for a packed-only stack), the
  // tile kernel on the file's rows for a prefill.
  // AVX-VNNI: the same kernel with vpdpbusd, for every n (prefill in slabs of rows).
  if (isa == Isa::kAvxVnni && w.packed != nullptr && avx2_reads_packed(w.type)) {
    SPECDEC_CHECK(isa_supported(isa), "matmul_isa: AVX-VNNI not supported here");
    for (int64_t i0 = 0; i0 < n; i0 += detail::kVnniPrefillSlab) {
      const int64_t rows = std::min(detail::kVnniPrefillSlab, n - i0);
      detail::packed_matmul_avxvnni(w, x + i0 * w.cols, rows, y + i0 * w.rows, pool);
    }
    return;
  }
  if (isa == Isa::kAvx2 && w.packed != nullptr && avx2_reads_packed(w.type) &&
      (n < detail::kPackedPanelMinRows || w.data == nullptr)) {
    SPECDEC_CHECK(isa_supported(isa), "matmul_isa: AVX2 not supported here");
    detail::packed_matmul_avx2(w, x, n, y, pool);
    return;
  }
  if (w.data == nullptr) {
    throw Error(std::string("matmul: this matrix exists only in the packed layout, which the ") +
                isa_name(isa) + " kernels cannot read");
  }
  switch (isa) {
    case Isa::kScalar:
      detail::matmul_ref(w, x, n, y, pool);
      return;
    case Isa::kAvx2:
    case Isa::kAvxVnni:  // unpacked matrices and types the packed kernel does not read
      SPECDEC_CHECK(isa_supported(isa), "matmul_isa: the ISA variant is not supported here");
      detail::matmul_avx2(w, x, n, y, pool);
      return;
    case Isa::kAvx512:
      SPECDEC_CHECK(isa_supported(Isa::kAvx512), "matmul_isa: AVX-512 not supported here");
      detail::matmul_avx512(w, x, n, y, pool);
      return;
  }
}

void matmul(const WeightMatrix& w, const float* x, int64_t n, float* y, ThreadPool* pool) {
  matmul_isa(active_isa(), w, x, n, y, pool);
}

void matmul_swiglu(const WeightMatrix& w, const float* gu, int64_t n, float* y, float* scratch,
                   ThreadPool* pool) {
  validate(w, n, "matmul_swiglu");
  if (n == 0 || w.rows == 0) return;
  if (gu == nullptr || y == nullptr) throw Error("matmul_swiglu: null activations or output");
  // Fused where the threads share the activation preparation (more than 4 rows); with fewer,
  // thread 0 prepares alone and a separate swiglu costs the same (in-process A/B, 1 row).
  if (active_isa() == Isa::kAvx512 && w.packed != nullptr && n > 4 &&
      n < detail::kPackedPanelMinRows) {
    detail::packed_matmul_avx512(w, gu, n, y, pool, /*glu=*/true);
    return;
  }
  if (scratch == nullptr) throw Error("matmul_swiglu: null scratch");
  auto rows = [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      swiglu(gu + i * 2 * w.cols, gu + i * 2 * w.cols + w.cols, w.cols, scratch + i * w.cols);
    }
  };
  if (pool != nullptr && n >= detail::kPackedPanelMinRows) {
    pool->parallel_for(n, 1, rows);  // a prefill's rows: worth a job of their own
  } else {
    rows(0, n);
  }
  matmul(w, scratch, n, y, pool);
}

void matmul_prefetch(const WeightMatrix& w, int ti, int nt, int64_t max_bytes) {
  if (w.packed == nullptr) return;
  if (active_isa() == Isa::kAvx512) {
    detail::packed_prefetch_avx512(w, ti, nt, max_bytes);
  } else if (isa_avx2_class(active_isa()) && avx2_reads_packed(w.type)) {
    detail::packed_prefetch_avx2(w, ti, nt, max_bytes);
  }
}

void dequantize_row(const WeightMatrix& w, int64_t row, float* out) {
  validate(w, 0, "dequantize_row");
  SPECDEC_CHECK(w.data != nullptr, "dequantize_row: the matrix exists only packed");
  if (row < 0 || row >= w.rows) {
    throw Error("dequantize_row: row " + std::to_string(row) + " out of range [0, " +
                std::to_string(w.rows) + ")");
  }
  const auto* p = static_cast<const uint8_t*>(w.data) + row * w.row_bytes;
  switch (w.type) {
    case GgmlType::kF32:
      std::memcpy(out, p, static_cast<size_t>(w.cols) * 4);
      return;
    case GgmlType::kF16:
      for (int64_t k = 0; k < w.cols; ++k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = fp16_to_fp32(h);
      }
      return;
    case GgmlType::kBF16:
      for (int64_t k = 0; k < w.cols; ++k) {
        uint16_t h;
        std::memcpy(&h, p + 2 * k, 2);
        out[k] = bf16_to_fp32(h);
      }
      return;
    default:
      break;
  }
  const QuantLayout layout = quant_layout(w.type);
  uint8_t q[32];  // [sub]
  for (int64_t b = 0; b < w.cols / layout.sub; ++b) {
    float dw, mw;
    decode_sub_block(w.type, p, b, q, &dw, &mw);
    float* o = out + b * layout.sub;
    for (int64_t j = 0; j < layout.sub; ++j) {
      o[j] = layout.has_min ? dw * static_cast<float>(q[j]) + mw
                            : dw * static_cast<float>(static_cast<int>(q[j]) - layout.offset);
    }
  }
}

}  // namespace specdec
