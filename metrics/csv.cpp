#include "metrics/csv.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "common/error.h"

namespace batchcast::metrics {

CsvFile::CsvFile(std::string path, const std::vector<std::string>& header)
    : path_(std::move(path)), out_(path_, std::ios::out | std::ios::trunc) {
  if (!out_) {
    throw Error("metrics: cannot write " + path_ + ": " + std::strerror(errno) +
                "; give the collector a writable directory (--metrics-dir)");
  }
  write_row(header);
}

void CsvFile::write_row(const std::vector<std::string>& cells) {
  if (!error_.empty()) return;  // stop after the first failure; it is reported once
  std::string line;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i) line += ',';
    const std::string& c = cells[i];
    if (c.find_first_of(",\"\n") == std::string::npos) {
      line += c;
    } else {
      line += '"';
      for (char ch : c) {
        if (ch == '"') line += '"';
        line += ch;
      }
      line += '"';
    }
  }
  line += '\n';
  out_ << line;
  out_.flush();
  if (!out_) error_ = path_ + ": " + std::strerror(errno);
}

std::string cell(std::optional<double> v, int decimals) {
  if (!v || std::isnan(*v)) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, *v);
  return buf;
}

}  // namespace batchcast::metrics
