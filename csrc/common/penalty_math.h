// Per-element penalty arithmetic shared by the CPU loops and the CUDA kernels, so both
// round the same way. Includes nothing from torch or CUDA.
#pragma once

#ifndef SPECOPS_HD
#if defined(__CUDACC__)
#define SPECOPS_HD __host__ __device__ __forceinline__
#else
#define SPECOPS_HD inline
#endif
#endif

namespace specops {

// vLLM order: repetition (divide positive / multiply non-positive logits of tokens seen in
// the prompt or the output), then frequency (minus f * count), then presence (minus p if
// count > 0). Multiplications are kept separate from the subtractions (no fused
// multiply-add) so that the CPU, CUDA and torch paths round identically.
SPECOPS_HD float penalize(float logit, bool in_prompt, int count, float rep, float freq, float pres) {
  if (in_prompt || count > 0) logit = logit > 0.0f ? logit / rep : logit * rep;
#if defined(__CUDA_ARCH__)
  logit = __fsub_rn(logit, __fmul_rn(freq, static_cast<float>(count)));
  if (count > 0) logit = __fsub_rn(logit, pres);
#else  // host: CMakeLists builds with -ffp-contract=off
  logit = logit - freq * static_cast<float>(count);
  if (count > 0) logit = logit - pres;
#endif
  return logit;
}

SPECOPS_HD float repetition_penalize(float logit, bool seen, float rep) {
  return seen ? (logit > 0.0f ? logit / rep : logit * rep) : logit;
}

// A row whose penalties are all neutral is left untouched: every formula above is the identity.
SPECOPS_HD bool penalties_neutral(float rep, float freq, float pres) {
  return rep == 1.0f && freq == 0.0f && pres == 0.0f;
}

}  // namespace specops
