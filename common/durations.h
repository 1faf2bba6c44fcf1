// Bounds shared by every duration a user can give (launcher flags, --rdzv_conf settings).
#pragma once

namespace ddprun {

// The longest duration accepted anywhere, in seconds (about 115 days): long enough for any
// real job, short enough that every duration stays representable in milliseconds (1e30 s
// once overflowed into "kill at once", join_timeout=1e16 into a negative timeout).
inline constexpr double kMaxDurationSeconds = 1e7;

}  // namespace ddprun
