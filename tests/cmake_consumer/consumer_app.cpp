// The installed-package consumer (tests/cmake_consumer/CMakeLists.txt): compiles against the
// installed headers and links batchcast::client only. Run with an endpoint where no server
// listens, it must report the documented outcome (an Error naming the endpoint) and exit 0.
#include <cstdio>
#include <string>

#include "client/consumer.h"
#include "common/error.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer_app ENDPOINT\n");
    return 2;
  }
  batchcast::ConsumerOptions options;
  options.endpoint = argv[1];
  options.timeout_s = 0.5;
  try {
    batchcast::Consumer consumer(options);
  } catch (const batchcast::Error& e) {
    std::printf("no server: %s\n", e.what());
    return 0;
  }
  std::fprintf(stderr, "a consumer connected to %s, where no server should run\n", argv[1]);
  return 1;
}
