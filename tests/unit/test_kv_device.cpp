// PagedKvStorage / KvCache with a KvDeviceMemory (kv_device.h), on the CPU with a fake device
// (its "device" memory is a host PagedKvStorage): no host buffer, write / read / copy_slot
// forwarded after the range checks, view() refused, copies deep (the device memory cloned).
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "kv/kv_cache.h"
#include "kv/kv_device.h"
#include "kv/paged_kv.h"
#include "util/check.h"

namespace specdec {
namespace {

class FakeDevice final : public KvDeviceMemory {
 public:
  FakeDevice(int n_layers, int n_kv_heads, int head_dim, int32_t n_blocks, int64_t block_slots,
             KvType type)
      : pool_(n_layers, n_kv_heads, head_dim, n_blocks, block_slots, type) {}
  const char* device_name() const override { return "fake"; }
  void write(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, const float* k,
             const float* v) override {
    ++writes;
    pool_.write(layer, table, slot, n, k, v);
  }
  void read(int layer, std::span<const int32_t> table, int64_t slot, int64_t n, float* k,
            float* v) const override {
    pool_.read(layer, table, slot, n, k, v);
  }
  void copy_slot(std::span<const int32_t> table, int64_t from, int64_t to) override {
    pool_.copy_slot(table, from, to);
  }
  std::unique_ptr<KvDeviceMemory> clone() const override {
    return std::make_unique<FakeDevice>(*this);
  }
  void* backend_handle() override { return this; }
  int writes = 0;

 private:
  PagedKvStorage pool_;
};

TEST(KvDevice, StorageForwardsAndChecks) {
  const int layers = 2, heads = 2, dim = 4;
  PagedKvStorage host(layers, heads, dim, 3, 16, KvType::kF16);
  PagedKvStorage dev(layers, heads, dim, 3, 16, KvType::kF16,
                     std::make_unique<FakeDevice>(layers, heads, dim, 3, 16, KvType::kF16));
  ASSERT_TRUE(dev.on_device());
  ASSERT_FALSE(host.on_device());
  EXPECT_EQ(dev.bytes(), host.bytes());
  const std::vector<int32_t> table = {2, 0};
  std::vector<float> k(20 * heads * dim), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = 0.37f * static_cast<float>(i) - 3.0f;
    v[i] = -0.11f * static_cast<float>(i) + 1.0f;
  }
  for (int l = 0; l < layers; ++l) {
    dev.write(l, table, 7, 20, k.data(), v.data());
    host.write(l, table, 7, 20, k.data(), v.data());
  }
  EXPECT_EQ(static_cast<FakeDevice*>(dev.device_memory())->writes, layers);
  dev.copy_slot(table, 9, 30);
  host.copy_slot(table, 9, 30);
  PagedKvStorage copy = dev;  // clones the device memory
  const std::vector<float> zeros(k.size(), 0.0f);
  dev.write(0, table, 7, 20, zeros.data(), zeros.data());
  host.write(0, table, 7, 20, zeros.data(), zeros.data());
  std::vector<float> a(32 * heads * dim), b(a.size()), c(a.size());
  for (int l = 0; l < layers; ++l) {
    dev.read(l, table, 0, 32, a.data(), nullptr);
    host.read(l, table, 0, 32, b.data(), nullptr);
    EXPECT_EQ(a, b) << "layer " << l;
    copy.read(l, table, 0, 32, nullptr, c.data());
    host.read(l, table, 0, 32, nullptr, b.data());
    if (l == 0) {
      EXPECT_NE(c, b) << "the copy shares the device memory";
    } else {
      EXPECT_EQ(c, b);
    }
  }
  EXPECT_THROW(dev.view(0, table.data()), Error);
  EXPECT_DEATH(dev.write(0, table, 30, 3, k.data(), v.data()), "outside the sequence's blocks");
}

TEST(KvDevice, KvCacheOnTheDevice) {
  KvCache kv(1, 1, 8, 40, KvType::kF32,
             std::make_unique<FakeDevice>(1, 1, 8, 1, KvCache::storage_slots(40), KvType::kF32));
  EXPECT_TRUE(kv.on_device());
  EXPECT_EQ(KvCache::storage_slots(40), 48);
  std::vector<float> row(8, 1.5f), got(8);
  kv.write(0, 39, 1, row.data(), row.data());
  KvCache copy = kv;
  kv.read(0, 39, 1, got.data(), nullptr);
  EXPECT_EQ(got, row);
  copy.read(0, 39, 1, nullptr, got.data());
  EXPECT_EQ(got, row);
  EXPECT_THROW(kv.k(0), Error);
}

}  // namespace
}  // namespace specdec
