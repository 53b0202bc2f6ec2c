// Emulated math constants and rounding intrinsics (see cuda_runtime.h).
#pragma once
#include <cmath>
#include <limits>
#define CUDART_INF_F std::numeric_limits<float>::infinity()
#define CUDART_INF std::numeric_limits<double>::infinity()
#define CUDART_NAN_F std::numeric_limits<float>::quiet_NaN()
#define CUDART_NAN std::numeric_limits<double>::quiet_NaN()
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
