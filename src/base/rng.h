/*
 * rng.h - deterministic, counter-based random numbers.
 *
 * Every random value in slicetrain is a pure function of (seed, stream,
 * counter), so results never depend on thread count, call order or mesh:
 * weight element k of tensor t is st_rng_normal(seed, t, k) wherever it is
 * computed. The mixer is SplitMix64's finalizer applied twice.
 */
#ifndef ST_BASE_RNG_H
#define ST_BASE_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint64_t st_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* 64 random bits for (seed, stream, counter). */
static inline uint64_t st_rng_u64(uint64_t seed, uint64_t stream, uint64_t counter)
{
	return st_mix64(st_mix64(seed ^ st_mix64(stream)) ^ counter);
}

/* Uniform in [0, 1) with 53 bits. */
static inline double st_rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter)
{
	return (double)(st_rng_u64(seed, stream, counter) >> 11) * 0x1.0p-53;
}

/* Uniform integer in [0, n), n > 0 (multiply-shift; bias < n / 2^64). */
static inline uint64_t st_rng_below(uint64_t seed, uint64_t stream, uint64_t counter, uint64_t n)
{
	return (uint64_t)(((unsigned __int128)st_rng_u64(seed, stream, counter) * n) >> 64);
}

/* Standard normal (Box-Muller on two counter-derived uniforms). */
static inline double st_rng_normal(uint64_t seed, uint64_t stream, uint64_t counter)
{
	double u1 = st_rng_uniform(seed, stream, 2 * counter);
	double u2 = st_rng_uniform(seed, stream, 2 * counter + 1);
	if (u1 < 1e-300)
		u1 = 1e-300;
	return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
