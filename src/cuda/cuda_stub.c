/* Built when CUDA=1 is not given: the GPU backend reports that it is absent. */
#include "cuda/cuda_backend.h"
int lcuda_available(char *why, size_t n) {
    snprintf(why, n, "this lily was built without CUDA (rebuild with make CUDA=1 CUDA_ARCH=sm_90a)");
    return 0;
}
