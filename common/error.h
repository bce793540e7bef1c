// Error types shared by every batchcast component.
//
// Contract: expected outcomes (a timeout, an empty queue, EAGAIN) are values, never
// exceptions. Real failures throw batchcast::Error, whose message names the thing that failed
// (file, sample, endpoint, segment) and, where one exists, the fix. Thread-safe: plain values.
#pragma once

#include <stdexcept>
#include <string>

namespace batchcast {

// Base class of every error batchcast throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A sample that cannot be decoded (corrupt, truncated, not an image, too large). `path` is the
// file; what() reads "<path>: <reason>".
class SampleError : public Error {
 public:
  SampleError(std::string path, const std::string& reason)
      : Error(path + ": " + reason), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The server went away (crashed, killed, or stopped answering heartbeats).
class ServerGoneError : public Error {
 public:
  using Error::Error;
};

// A position asked of the server (Consumer::seek) that it no longer holds and cannot produce
// again; the consumer stays attached and may seek elsewhere.
class PositionUnavailableError : public Error {
 public:
  using Error::Error;
};

// A wait ran out; raised by blocking consumer calls whose caller asked for a deadline.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace batchcast
