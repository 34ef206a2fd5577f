// Measured ceilings of this machine, which `specdec bench` and bench/micro compare kernels with.
// Each is a best-of-several maximum over all threads of the pool (nullptr: one thread), so a
// kernel's fraction of it is an honest "% of what the hardware does here".
#pragma once

#include "backend/cpu/cpu_features.h"

namespace specdec {

class ThreadPool;

// fp32 FMA peak in GFLOP/s (2 FLOP per lane per FMA): a dependency-free loop of fused
// multiply-adds with enough independent accumulators on every thread. kScalar measures scalar
// SSE multiply + add pairs.
double measure_peak_gflops(Isa isa, ThreadPool* pool);

// int8 multiply-accumulate peak in GOP/s (2 OP per u8 x s8 product): vpdpbusd on AVX-512 VNNI,
// vpmaddubsw on AVX2 (its s16 pair sums still need widening, so kernels cannot reach it fully),
// scalar integer multiply-add otherwise.
double measure_peak_int8_gops(Isa isa, ThreadPool* pool);

// Streaming read bandwidth from DRAM in GB/s (1e9 bytes): every thread sums its share of a
// 512 MiB buffer (touched once before timing), widest loads the CPU supports, best of 8 runs.
double measure_read_bandwidth_gbs(ThreadPool* pool);

namespace detail {
// Per-ISA loops: run for `iters` iterations, return a value that depends on the work (so it is
// not optimized away). FLOP / OP per iteration are returned through *ops_per_iter.
double fma_loop_avx2(long iters, double* ops_per_iter);
double fma_loop_avx512(long iters, double* ops_per_iter);
double int8_loop_avx2(long iters, double* ops_per_iter);
double int8_loop_avx512(long iters, double* ops_per_iter);
double int8_loop_avxvnni(long iters, double* ops_per_iter);
double read_sum_avx2(const void* data, long bytes);
double read_sum_avx512(const void* data, long bytes);
}  // namespace detail

}  // namespace specdec
