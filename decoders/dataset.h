// Dataset readers: the ordered list of (file path, integer label) samples the server streams.
//
// Contract: a Dataset is an immutable value once built (copyable, thread-safe to read from any
// number of threads). Building one touches the file system; errors throw batchcast::Error naming
// the folder, file or line at fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace batchcast {

struct DatasetEntry {
  std::string path;
  int64_t label = 0;
};

class Dataset {
 public:
  // torchvision.datasets.ImageFolder semantics, entry for entry: class folders are the
  // sub-directories of `root` (symlinks followed) sorted by name; files are walked recursively
  // like os.walk(followlinks=True), directories visited in sorted path order and files sorted
  // within each; a file is a sample if its name ends, case-insensitively, in one of torchvision's
  // IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp). Paths are
  // os.path.join(root, class, ...). Throws Error naming the folder if it is missing, has no class
  // folder, or a class folder holds no image (torchvision raises for that too). The class folders
  // are walked on up to 8 threads of its own, joined before it returns.
  static Dataset image_folder(const std::string& root);

  // A text file of "path label" lines. Paths are relative to the list file's folder unless
  // absolute; a path may contain spaces (the label is the last field). '#' comment lines and
  // blank lines are skipped. Throws Error naming "file:line" for a malformed line, and naming the
  // file when it cannot be read or lists nothing.
  static Dataset file_list(const std::string& list_file);

  size_t size() const { return entries_.size(); }
  const DatasetEntry& operator[](size_t i) const { return entries_[i]; }
  const std::vector<DatasetEntry>& entries() const { return entries_; }
  // Class names in label order; empty for file lists.
  const std::vector<std::string>& classes() const { return classes_; }

 private:
  std::vector<DatasetEntry> entries_;
  std::vector<std::string> classes_;
};

// torchvision's IMG_EXTENSIONS check (case-insensitive suffix match).
bool has_image_extension(const std::string& file_name);

}  // namespace batchcast
