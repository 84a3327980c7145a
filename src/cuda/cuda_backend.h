/* The CUDA backend behind a plain C interface. Only this header is visible to the
 * engine; the kernels live in .cu files compiled with make CUDA=1. */
#ifndef LILY_CUDA_BACKEND_H
#define LILY_CUDA_BACKEND_H
#include <stddef.h>
#include <stdio.h>
/* 1 when a usable GPU is present; otherwise 0 and a reason in why. */
int lcuda_available(char *why, size_t n);
#endif
