// StallPolicy: what the stream does about a consumer that holds it back (docs/stream.md), the
// names the command line and Python give the policies, and the default stall bound. Every
// layer (StreamRules, StreamHostOptions, ServeConfig, the bindings, the Python package) takes
// the names and the bound from here.
//
// Thread-safety: constants, initialised before main; read from any thread.
#pragma once

#include <map>
#include <string>

namespace batchcast {

enum class StallPolicy { kWait, kSkip, kDecouple };

// `--stall-policy NAME` and Python's `stall_policy="NAME"`.
inline const std::map<std::string, StallPolicy> kStallPolicyNames = {
    {"wait", StallPolicy::kWait},
    {"skip", StallPolicy::kSkip},
    {"decouple", StallPolicy::kDecouple}};

// Seconds a consumer may hold the stream back (decouple) or ask for nothing (skip) before the
// policy acts, unless the server or the consumer sets its own; also when a stall is logged.
inline constexpr double kDefaultStallTimeoutS = 3.0;

}  // namespace batchcast
