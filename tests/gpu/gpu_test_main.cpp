// main() of the GPU test executables of tests/gpu: without a CUDA device none of their tests runs and
// the executable exits 77, which ctest reports as skipped (SKIP_RETURN_CODE, tests/gpu/CMakeLists.txt).
// Listing the tests (--gtest_list_tests) needs no device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int devices = 0;
  if (!GTEST_FLAG_GET(list_tests) && (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0)) {
    std::printf("%s: no CUDA device, nothing checked (exit 77: skipped)\n", argv[0]);
    return 77;
  }
  return RUN_ALL_TESTS();
}
