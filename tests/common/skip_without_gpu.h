// For the tests under tests/cuda (built with -DSPECDEC_CUDA=ON): skip the test on a machine
// without a usable CUDA device.
#pragma once

#include <gtest/gtest.h>

#include "backend/cuda/cuda_ops.h"

#define SKIP_WITHOUT_GPU()                                    \
  do {                                                        \
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)
