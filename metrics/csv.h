// A CSV file written row by row, for the collector's time series.
//
// Contract: the constructor creates/truncates the file and throws batchcast::Error naming it if
// it cannot; write_row() never throws (a failed write is remembered, see error()), because it
// runs on the sampler thread where nobody could catch it; each row is flushed so a crashed run
// still leaves readable series. Not thread-safe: one writer (the sampler thread). RAII: the
// std::ofstream closes the file.
#pragma once

#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace batchcast::metrics {

class CsvFile {
 public:
  CsvFile(std::string path, const std::vector<std::string>& header);

  // Cells are written as given, quoted when they hold a comma, quote or newline.
  void write_row(const std::vector<std::string>& cells);
  // Empty while every write succeeded; else "<path>: <reason>".
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ofstream out_;
  std::string error_;
};

// Formats a number for a CSV cell with `decimals` digits; nullopt (or NaN) becomes "".
std::string cell(std::optional<double> v, int decimals = 3);

}  // namespace batchcast::metrics
