#include "protocol/endpoint.h"

#include <unistd.h>

#include "common/error.h"

namespace batchcast::protocol {

std::string default_endpoint() {
  return "ipc:///tmp/batchcast-" + std::to_string(::getuid()) + ".sock";
}

std::string rank_endpoint(const std::string& endpoint, uint32_t rank) {
  if (endpoint.rfind("ipc://", 0) == 0) return endpoint + ".rank" + std::to_string(rank);
  const size_t colon = endpoint.rfind(':');
  if (endpoint.rfind("tcp://", 0) == 0 && colon > 6 && colon + 1 < endpoint.size() &&
      endpoint.find_first_not_of("0123456789", colon + 1) == std::string::npos &&
      endpoint.size() - colon - 1 <= 5) {
    const unsigned long port = std::stoul(endpoint.substr(colon + 1)) + rank;
    if (port > 65535)
      throw Error("endpoint " + endpoint + ": rank " + std::to_string(rank) +
                  " would listen on port " + std::to_string(port) +
                  ", past 65535; pick a lower port");
    return endpoint.substr(0, colon + 1) + std::to_string(port);
  }
  throw Error("endpoint " + endpoint +
              ": a server of every rank needs ipc://PATH or tcp://HOST:PORT (rank r then listens "
              "on PATH.rank<r> or PORT + r)");
}

std::string failure_record_path(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) != 0 || endpoint.size() == 6 || endpoint[6] == '@') return "";
  return endpoint.substr(6) + ".failed";
}

}  // namespace batchcast::protocol
