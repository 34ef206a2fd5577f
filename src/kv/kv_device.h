// Where a paged KV pool's bytes live when they are not in host memory (the CUDA backend's pool in
// GPU memory). A PagedKvStorage built with one allocates no host buffer and forwards write /
// read / copy_slot to it, with the same contracts (PagedKvStorage checks the ranges first, so an
// implementation gets slots inside the table and block ids the caller vouches for). The layout
// is the backend's own; the backend's model reaches it through backend_handle() (or a
// dynamic_cast to its subclass).
#pragma once

#include <cstdint>
#include <memory>
#include <span>

namespace specdec {

class KvDeviceMemory {
 public:
  virtual ~KvDeviceMemory() = default;

  // "cuda": for messages.
  virtual const char* device_name() const = 0;

  // As PagedKvStorage::write: the float rows k, v: [n, n_kv_heads, head_dim] at the sequence's
  // slots [slot, slot + n) of `layer`, converted to the pool's type (round to nearest even).
  virtual void write(int layer, std::span<const int32_t> table, int64_t slot, int64_t n,
                     const float* k, const float* v) = 0;
  // As PagedKvStorage::read: slots [slot, slot + n) of `layer` back as floats (k or v may be null).
  virtual void read(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, float* k,
                    float* v) const = 0;
  // As PagedKvStorage::copy_slot: slot `from` of the sequence to slot `to`, every layer.
  virtual void copy_slot(std::span<const int32_t> table, int64_t from, int64_t to) = 0;

  // A deep copy (a copied PagedKvStorage / KvCache owns its own device pool).
  virtual std::unique_ptr<KvDeviceMemory> clone() const = 0;

  // The backend's view of the pool (for the CUDA backend: the CudaKvMemory itself).
  virtual void* backend_handle() = 0;
};

}  // namespace specdec
