// splitmix64 (Steele, Lea and Flood, 2014): the finalizer that turns a 64-bit value into a
// well-mixed one (the seeds of per-layer sketches, rotations and codebooks), and the generator
// that steps a state by the golden-ratio increment and mixes it (random test and synthetic weights).
#pragma once

#include <cstdint>

namespace vxq {

inline uint64_t splitmix64_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

inline uint64_t splitmix64(uint64_t& state) { return splitmix64_mix(state += 0x9E3779B97F4A7C15ull); }

}  // namespace vxq
