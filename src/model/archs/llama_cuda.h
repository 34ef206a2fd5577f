// The `llama` architecture on an NVIDIA GPU (built with -DSPECDEC_CUDA=ON): the weights in their
// GGUF types in device memory, the forward pass as cuda_ops.h kernels, the KV cache in a device
// pool (CudaKvMemory). Same contract and data flow as the CPU model (llama.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/cuda/cuda_ops.h"
#include "kv/kv_device.h"
#include "model/model.h"

namespace specdec {

// A paged KV pool in device memory, cuda_ops.h's layout:
//   K, V: [n_layers, n_blocks, block_slots, n_kv_heads, head_dim] of type (f16: IEEE half).
// write / read convert on the host (the CPU's f32_to_f16 / f16_to_f32) and move the rows of each
// block piece with one upload / download; copy_slot runs on the device. Zeroed at construction.
class CudaKvMemory final : public KvDeviceMemory {
 public:
  CudaKvMemory(int n_layers, int n_kv_heads, int head_dim, int32_t n_blocks, int64_t block_slots,
               KvType type);

  const char* device_name() const override { return "cuda"; }
  void write(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, const float* k,
             const float* v) override;
  void read(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, float* k,
            float* v) const override;
  void copy_slot(std::span<const int32_t> table, int64_t from, int64_t to) override;
  std::unique_ptr<KvDeviceMemory> clone() const override;
  void* backend_handle() override { return this; }

  // Layer `layer` for the kernels.
  cuda::DeviceKvLayer layer(int layer) const;

  int n_layers() const { return n_layers_; }
  int n_kv_heads() const { return n_kv_heads_; }
  int head_dim() const { return head_dim_; }
  int32_t n_blocks() const { return n_blocks_; }
  int64_t block_slots() const { return block_slots_; }
  KvType type() const { return type_; }
  // The K and V pools (device; pool_bytes each): the forward pass keys its CUDA graphs on them.
  const void* k_data() const { return k_.data(); }
  const void* v_data() const { return v_.data(); }
  size_t pool_bytes() const { return k_.bytes(); }

 private:
  struct NoInit {};
  CudaKvMemory(const CudaKvMemory& shape, NoInit);
  int64_t row_bytes() const { return row_elems_ * static_cast<int64_t>(kv_type_bytes(type_)); }
  int64_t layer_elems() const { return static_cast<int64_t>(n_blocks_) * block_slots_ * row_elems_; }
  // Byte offset of physical slot `phys` of `layer` in k_ / v_.
  size_t offset(int layer, int64_t phys) const {
    return static_cast<size_t>((layer * layer_elems() + phys * row_elems_) *
                               static_cast<int64_t>(kv_type_bytes(type_)));
  }
  void check_blocks(std::span<const int32_t> table, int64_t slot, int64_t n) const;

  int n_layers_;
  int n_kv_heads_;
  int head_dim_;
  int64_t row_elems_;
  int32_t n_blocks_;
  int64_t block_slots_;
  KvType type_;
  cuda::DeviceBuffer k_;
  cuda::DeviceBuffer v_;
};

// Loads the GGUF at `path` onto the GPU (Model::load(path, Device::kCuda)). Throws
// specdec::Error("no CUDA device") without a GPU, and naming the file and tensor when a tensor
// is missing, mis-shaped or of a type the CUDA kernels do not support.
std::unique_ptr<Model> load_cuda_llama(const std::string& path);

}  // namespace specdec
