// Endpoint naming: where a server listens and its consumers connect (ZeroMQ addresses), and
// the file a server at an endpoint leaves behind when its stream failed. Plain functions of
// strings and the uid; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace batchcast::protocol {

// The endpoint used when none is given: ipc:///tmp/batchcast-<uid>.sock.
std::string default_endpoint();

// The endpoint of rank `rank`'s stream of a server that serves every rank of a job from one
// process (serve --every-rank): ipc://PATH -> ipc://PATH.rank<rank>, tcp://HOST:PORT ->
// tcp://HOST:<PORT + rank>. Throws batchcast::Error for other forms or a port past 65535.
std::string rank_endpoint(const std::string& endpoint, uint32_t rank);

// Where a server at `endpoint` records why its stream failed, for consumers that arrive after
// it exited: "<socket path>.failed" for ipc://PATH; "" (no record) for tcp and abstract ipc.
std::string failure_record_path(const std::string& endpoint);

}  // namespace batchcast::protocol
