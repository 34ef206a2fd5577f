// CUDA graphs of the backend's stream, pinned host memory and asynchronous copies (cuda_ops.h,
// the section "CUDA graphs").
//
// GraphCache: key -> entry {times seen, cudaGraphExec_t, the foreign allocations it uses}.
//   prepare: a cached graph whose foreign allocations are all still the same (same buffer id at
//   the same address: cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID), a process-wide
//   unique id per allocation, never reused) is launched; one that is not is dropped. A key seen
//   before without a graph is captured; a new key runs normally.
//   end_capture: ends the capture, walks the recorded nodes (kernel arguments, by
//   cudaFuncGetParamInfo; memset / memcpy addresses), takes every 8-byte-aligned word that points
//   into a live device allocation outside the caller's known ranges as foreign, instantiates and
//   launches. Any failure there: the key is marked uncapturable (runs normally from then on) and
//   a line goes to stderr once per process.
#include <cuda.h>  // CUpointer_attribute (the driver function is fetched at run time: no -lcuda)

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.cuh"
#include "backend/cuda/cuda_ops.h"

namespace specdec::cuda {
namespace {

using detail::stream;

std::atomic<bool>& enabled_flag() {
  static std::atomic<bool> f{[] {
    const char* e = std::getenv("SPECDEC_CUDA_GRAPHS");
    return !(e != nullptr && std::strcmp(e, "0") == 0);
  }()};
  return f;
}

struct Counters {
  std::atomic<int64_t> captures{0}, replays{0}, invalidated{0}, failed{0};
};
Counters& counters() {
  static Counters c;
  return c;
}

void warn_once(const std::string& what) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr, "specdec: a CUDA graph could not be used (%s); that pass shape runs "
                 "without one (further such messages suppressed)\n", what.c_str());
  }
}

// cuPointerGetAttribute from the driver, without linking libcuda.
using PointerGetAttributeFn = CUresult (*)(void* data, CUpointer_attribute attribute,
                                           CUdeviceptr ptr);
PointerGetAttributeFn pointer_get_attribute() {
  static const PointerGetAttributeFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &p, 12000, cudaEnableDefault, &q);
    if (err != cudaSuccess || q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return static_cast<PointerGetAttributeFn>(nullptr);
    }
    return reinterpret_cast<PointerGetAttributeFn>(p);
  }();
  return fn;
}

// The buffer id of the device allocation holding `ptr`; false when it is not device memory.
bool buffer_id(PointerGetAttributeFn fn, uint64_t ptr, unsigned long long* id) {
  *id = 0;
  return fn(id, CU_POINTER_ATTRIBUTE_BUFFER_ID, static_cast<CUdeviceptr>(ptr)) == CUDA_SUCCESS;
}

struct Foreign {
  uint64_t ptr = 0;             // an address the graph uses
  unsigned long long id = 0;    // the buffer id of its allocation at capture
};

// Collects the foreign allocations of `graph` (see the top). False (with `why`) when a node
// cannot be inspected.
bool collect_foreign(cudaGraph_t graph, const std::vector<DeviceRange>& known,
                     std::vector<Foreign>* out, std::string* why) {
  out->clear();
  const PointerGetAttributeFn fn = pointer_get_attribute();
  if (fn == nullptr) {
    *why = "cuPointerGetAttribute is not available";
    return false;
  }
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // [begin, end), sorted
  for (const DeviceRange& r : known) {
    if (r.data == nullptr || r.bytes == 0) continue;
    const auto b = reinterpret_cast<uint64_t>(r.data);
    ranges.emplace_back(b, b + r.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  auto is_known = [&](uint64_t v) {
    // Any range with begin <= v < end (ranges may overlap; the lists are short).
    auto it = std::upper_bound(ranges.begin(), ranges.end(),
                               std::make_pair(v, ~uint64_t{0}));  // first begin > v
    while (it != ranges.begin()) {
      --it;
      if (v < it->second) return true;
    }
    return false;
  };
  std::vector<unsigned long long> seen_ids;
  auto check = [&](uint64_t v) {
    if (v < (uint64_t{1} << 16)) return;  // small integers: never an allocation
    if (is_known(v)) return;
    unsigned long long id = 0;
    if (!buffer_id(fn, v, &id)) return;   // not device memory (a scalar, or host memory)
    if (std::find(seen_ids.begin(), seen_ids.end(), id) != seen_ids.end()) return;
    seen_ids.push_back(id);
    out->push_back({v, id});
  };
  auto check_bytes = [&](const void* p, size_t offset, size_t size) {
    // Every 8-byte word at an 8-aligned offset of the argument buffer (pointers, also inside
    // struct arguments, are 8-aligned there).
    const auto* bytes = static_cast<const unsigned char*>(p);
    for (size_t j = (8 - offset % 8) % 8; j + 8 <= size; j += 8) {
      uint64_t v = 0;
      std::memcpy(&v, bytes + j, 8);
      check(v);
    }
  };

  size_t n = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess) {
    *why = "cudaGraphGetNodes failed";
    return false;
  }
  std::vector<cudaGraphNode_t> nodes(n);
  if (n > 0 && cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) {
    *why = "cudaGraphGetNodes failed";
    return false;
  }
  size_t n_kernels = 0, n_args = 0;  // (kernels with packed arguments not counted)
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess) {
      *why = "cudaGraphNodeGetType failed";
      return false;
    }
    switch (type) {
      case cudaGraphNodeTypeKernel: {
        cudaKernelNodeParams p{};
        if (cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess) {
          *why = "cudaGraphKernelNodeGetParams failed";
          return false;
        }
        if (p.func == nullptr) {
          *why = "a kernel node without its function";
          return false;
        }
        if (p.kernelParams == nullptr && p.extra != nullptr) {
          // The packed form: {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE,
          // &size, CU_LAUNCH_PARAM_END}: every aligned word of the buffer.
          const void* buf = nullptr;
          size_t buf_size = 0;
          for (void** x = p.extra; x[0] != CU_LAUNCH_PARAM_END; x += 2) {
            if (x[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = x[1];
            if (x[0] == CU_LAUNCH_PARAM_BUFFER_SIZE) buf_size = *static_cast<size_t*>(x[1]);
          }
          if (buf_size > 0 && buf == nullptr) {
            *why = "a kernel node with packed arguments but no buffer";
            return false;
          }
          check_bytes(buf, 0, buf_size);
          break;
        }
        for (size_t i = 0;; ++i) {
          size_t offset = 0, size = 0;
          const cudaError_t err = cudaFuncGetParamInfo(p.func, i, &offset, &size);
          if (err == cudaErrorInvalidValue) {  // past the last argument
            (void)cudaGetLastError();
            if (i == 0) {  // no arguments at all, or a function it does not know: tell apart
              cudaFuncAttributes attr{};
              if (cudaFuncGetAttributes(&attr, p.func) != cudaSuccess) {
                (void)cudaGetLastError();
                *why = "cudaFuncGetParamInfo does not know a recorded kernel";
                return false;
              }
            }
            break;
          }
          if (err != cudaSuccess) {
            *why = std::string("cudaFuncGetParamInfo: ") + cudaGetErrorString(err);
            return false;
          }
          if (p.kernelParams == nullptr || p.kernelParams[i] == nullptr) {
            *why = "a kernel node without its arguments";
            return false;
          }
          check_bytes(p.kernelParams[i], offset, size);
          ++n_args;
        }
        ++n_kernels;
        break;
      }
      case cudaGraphNodeTypeMemset: {
        cudaMemsetParams p{};
        if (cudaGraphMemsetNodeGetParams(node, &p) != cudaSuccess) {
          *why = "cudaGraphMemsetNodeGetParams failed";
          return false;
        }
        check(reinterpret_cast<uint64_t>(p.dst));
        break;
      }
      case cudaGraphNodeTypeMemcpy: {
        cudaMemcpy3DParms p{};
        if (cudaGraphMemcpyNodeGetParams(node, &p) != cudaSuccess) {
          *why = "cudaGraphMemcpyNodeGetParams failed";
          return false;
        }
        if (p.srcArray != nullptr || p.dstArray != nullptr) {
          *why = "a memcpy node with a CUDA array";
          return false;
        }
        check(reinterpret_cast<uint64_t>(p.srcPtr.ptr));
        check(reinterpret_cast<uint64_t>(p.dstPtr.ptr));
        break;
      }
      case cudaGraphNodeTypeEmpty:
        break;
      default:
        *why = "a graph node of type " + std::to_string(static_cast<int>(type));
        return false;
    }
  }
  if (n_kernels > 0 && n_args == 0) {  // every kernel of the backend takes arguments
    *why = "no kernel arguments found in the recorded graph";
    return false;
  }
  return true;
}

}  // namespace

// ---- switches and counters ---------------------------------------------------------------------

bool graphs_enabled() { return enabled_flag().load(std::memory_order_relaxed); }
void set_graphs_enabled(bool enabled) { enabled_flag().store(enabled); }

GraphStats graph_stats() {
  const Counters& c = counters();
  GraphStats s;
  s.captures = c.captures.load();
  s.replays = c.replays.load();
  s.invalidated = c.invalidated.load();
  s.failed = c.failed.load();
  return s;
}

// ---- pinned memory and asynchronous copies -----------------------------------------------------

PinnedBuffer::~PinnedBuffer() {
  if (p_ != nullptr) (void)cudaFreeHost(p_);  // no throw (destructor)
}

void PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= bytes_) return;
  const size_t want = std::max(bytes, 2 * bytes_);
  CUDA_CHECK(cudaStreamSynchronize(stream()));  // a queued copy may still use the old memory
  if (p_ != nullptr) {
    CUDA_CHECK(cudaFreeHost(p_));
    p_ = nullptr;
    bytes_ = 0;
  }
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocDefault));
  p_ = p;
  bytes_ = want;
}

void upload_async(void* dst_device, const void* src_host, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst_device, src_host, bytes, cudaMemcpyHostToDevice, stream()));
}

void download_async(void* dst_host, const void* src_device, size_t bytes) {
  if (bytes == 0) return;
  CUDA_CHECK(cudaMemcpyAsync(dst_host, src_device, bytes, cudaMemcpyDeviceToHost, stream()));
}

// ---- GraphCache --------------------------------------------------------------------------------

struct GraphCache::Impl {
  struct Entry {
    int seen = 0;                   // sightings without a graph (2nd: capture)
    bool uncapturable = false;      // a capture failed: always run normally
    cudaGraphExec_t exec = nullptr;
    std::vector<Foreign> foreign;
    uint64_t used = 0;              // LRU clock
  };
  int max_graphs;
  int n_graphs = 0;
  uint64_t clock = 0;
  bool capturing = false;
  std::map<std::vector<int64_t>, Entry> entries;

  static void destroy(Entry& e) {
    if (e.exec != nullptr) (void)cudaGraphExecDestroy(e.exec);  // no throw (also at teardown)
    e.exec = nullptr;
    e.foreign.clear();
  }
  void drop_graph(Entry& e) {
    if (e.exec == nullptr) return;
    destroy(e);
    --n_graphs;
  }
  // Keeps at most max_graphs graphs and 4 * max_graphs entries (least recently used go), never
  // `keep`.
  void evict(const Entry* keep) {
    while (n_graphs > max_graphs) {
      Entry* lru = nullptr;
      for (auto& [k, e] : entries) {
        if (e.exec != nullptr && &e != keep && (lru == nullptr || e.used < lru->used)) lru = &e;
      }
      if (lru == nullptr) break;
      drop_graph(*lru);
    }
    const size_t max_entries = static_cast<size_t>(4 * std::max(max_graphs, 1));
    while (entries.size() > max_entries) {
      auto lru = entries.end();
      for (auto it = entries.begin(); it != entries.end(); ++it) {
        if (&it->second != keep && (lru == entries.end() || it->second.used < lru->second.used)) {
          lru = it;
        }
      }
      if (lru == entries.end()) break;
      drop_graph(lru->second);
      entries.erase(lru);
    }
  }
  bool still_valid(const Entry& e) const {
    if (e.foreign.empty()) return true;
    const PointerGetAttributeFn fn = pointer_get_attribute();
    if (fn == nullptr) return false;
    for (const Foreign& f : e.foreign) {
      unsigned long long id = 0;
      if (!buffer_id(fn, f.ptr, &id) || id != f.id) return false;
    }
    return true;
  }
  void fail(const std::vector<int64_t>& key, const std::string& why) {
    Entry& e = entries[key];
    drop_graph(e);
    e.uncapturable = true;
    counters().failed.fetch_add(1);
    warn_once(why);
  }
};

GraphCache::GraphCache(int max_graphs) : impl_(new Impl) {
  impl_->max_graphs = std::max(max_graphs, 1);
}

GraphCache::~GraphCache() {
  for (auto& [k, e] : impl_->entries) Impl::destroy(e);
  delete impl_;
}

GraphCache::Step GraphCache::prepare(const std::vector<int64_t>& key) {
  Impl& m = *impl_;
  auto it = m.entries.find(key);
  if (it == m.entries.end()) {
    Impl::Entry& e = m.entries[key];
    e.seen = 1;
    e.used = ++m.clock;
    m.evict(&e);
    return Step::kRun;
  }
  Impl::Entry& e = it->second;
  e.used = ++m.clock;
  if (e.uncapturable) return Step::kRun;
  if (e.exec != nullptr) {
    if (m.still_valid(e)) {
      CUDA_CHECK(cudaGraphLaunch(e.exec, stream()));
      counters().replays.fetch_add(1, std::memory_order_relaxed);
      return Step::kReplayed;
    }
    // Memory the graph uses was reallocated (the matmul scratch grew): this pass runs normally
    // (sizing everything for its shape), the next sight captures again.
    m.drop_graph(e);
    e.seen = 1;
    counters().invalidated.fetch_add(1);
    return Step::kRun;
  }
  return ++e.seen >= 2 ? Step::kCapture : Step::kRun;
}

void GraphCache::queue(const std::vector<int64_t>& key, const std::function<void()>& work,
                       const std::function<std::vector<DeviceRange>()>& known) {
  switch (prepare(key)) {
    case Step::kReplayed:
      return;
    case Step::kCapture: {
      begin_capture();
      bool recorded = true;
      try {
        work();
      } catch (const std::exception& e) {
        abort_capture(key, e.what());
        recorded = false;
      } catch (...) {
        abort_capture(key, "unknown exception");
        recorded = false;
      }
      if (recorded && end_capture(key, known())) return;
      work();
      return;
    }
    case Step::kRun:
      work();
      return;
  }
}

void GraphCache::begin_capture() {
  CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  impl_->capturing = true;
}

void GraphCache::abort_capture(const std::vector<int64_t>& key, const char* why) {
  Impl& m = *impl_;
  if (m.capturing) {
    m.capturing = false;
    cudaGraph_t g = nullptr;
    (void)cudaStreamEndCapture(stream(), &g);
    if (g != nullptr) (void)cudaGraphDestroy(g);
  }
  (void)cudaGetLastError();  // a failed call inside the capture must not fail the next launch
  m.fail(key, std::string("capture: ") + why);
}

bool GraphCache::end_capture(const std::vector<int64_t>& key,
                             const std::vector<DeviceRange>& known) {
  Impl& m = *impl_;
  m.capturing = false;
  cudaGraph_t g = nullptr;
  const cudaError_t err = cudaStreamEndCapture(stream(), &g);
  if (err != cudaSuccess || g == nullptr) {
    if (g != nullptr) (void)cudaGraphDestroy(g);
    (void)cudaGetLastError();
    m.fail(key, std::string("cudaStreamEndCapture: ") + cudaGetErrorString(err));
    return false;
  }
  std::vector<Foreign> foreign;
  std::string why;
  const bool inspected = collect_foreign(g, known, &foreign, &why);
  (void)cudaGetLastError();  // cudaFuncGetParamInfo's out-of-range answer is recorded as an error
  if (!inspected) {
    (void)cudaGraphDestroy(g);
    m.fail(key, why);
    return false;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ierr = cudaGraphInstantiate(&exec, g, 0);
  (void)cudaGraphDestroy(g);  // the executable graph does not need it
  if (ierr != cudaSuccess || exec == nullptr) {
    if (exec != nullptr) (void)cudaGraphExecDestroy(exec);
    (void)cudaGetLastError();
    m.fail(key, std::string("cudaGraphInstantiate: ") + cudaGetErrorString(ierr));
    return false;
  }
  Impl::Entry& e = m.entries[key];
  m.drop_graph(e);
  e.exec = exec;
  e.foreign = std::move(foreign);
  e.seen = 0;
  e.used = ++m.clock;
  ++m.n_graphs;
  m.evict(&e);
  CUDA_CHECK(cudaGraphLaunch(exec, stream()));
  counters().captures.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void GraphCache::clear() {
  Impl& m = *impl_;
  for (auto& [k, e] : m.entries) m.drop_graph(e);
  m.entries.clear();
  m.n_graphs = 0;
}

int GraphCache::size() const { return impl_->n_graphs; }

}  // namespace specdec::cuda
