#include "decoders/dataset.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "common/error.h"

namespace batchcast {
namespace {

constexpr const char* kImageExtensions[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                            ".pgm", ".tif",  ".tiff", ".webp"};
constexpr size_t kScanThreads = 8;

// os.path.join for two POSIX components.
std::string join_path(const std::string& a, const std::string& b) {
  if (!b.empty() && b.front() == '/') return b;
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

// Closes a DIR* on scope exit.
class DirectoryStream {
 public:
  explicit DirectoryStream(const std::string& path) : dir_(::opendir(path.c_str())) {}
  ~DirectoryStream() noexcept {
    if (dir_ != nullptr) ::closedir(dir_);
  }
  DirectoryStream(const DirectoryStream&) = delete;
  DirectoryStream& operator=(const DirectoryStream&) = delete;
  DIR* get() const { return dir_; }

 private:
  DIR* dir_;
};

struct DirectoryListing {
  std::vector<std::string> directories;  // DirEntry.is_dir(): symlinks followed
  std::vector<std::string> files;        // everything else, broken symlinks included
};

// os.scandir + DirEntry.is_dir() (follow_symlinks=True; a failing stat counts as "not a dir").
// Returns false if the directory cannot be opened (os.walk then skips it silently).
bool list_directory(const std::string& path, DirectoryListing* listing) {
  DirectoryStream stream(path);
  if (stream.get() == nullptr) return false;
  while (dirent* entry = ::readdir(stream.get())) {
    std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    bool is_dir = false;
    if (entry->d_type == DT_DIR) {
      is_dir = true;
    } else if (entry->d_type == DT_LNK || entry->d_type == DT_UNKNOWN) {
      struct stat info {};
      is_dir = ::stat(join_path(path, name).c_str(), &info) == 0 && S_ISDIR(info.st_mode);
    }
    (is_dir ? listing->directories : listing->files).push_back(std::move(name));
  }
  return true;
}

struct WalkedDirectory {
  std::string root;
  std::vector<std::string> files;
};

// os.walk(top, followlinks=True), collecting (root, files). `ancestors` holds the (device, inode)
// of the directories on the current path so a symlink cycle ends instead of recursing forever.
void walk(const std::string& top, std::set<std::pair<dev_t, ino_t>>& ancestors,
          std::vector<WalkedDirectory>* out) {
  struct stat info {};
  if (::stat(top.c_str(), &info) != 0) return;
  auto key = std::make_pair(info.st_dev, info.st_ino);
  if (!ancestors.insert(key).second) return;
  DirectoryListing listing;
  if (list_directory(top, &listing)) {
    out->push_back(WalkedDirectory{top, std::move(listing.files)});
    for (const std::string& name : listing.directories) walk(join_path(top, name), ancestors, out);
  }
  ancestors.erase(key);
}

std::string trim(const std::string& s) {
  const char* whitespace = " \t\r\n\f\v";
  size_t begin = s.find_first_not_of(whitespace);
  if (begin == std::string::npos) return "";
  size_t end = s.find_last_not_of(whitespace);
  return s.substr(begin, end - begin + 1);
}

}  // namespace

bool has_image_extension(const std::string& file_name) {
  std::string lower = file_name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* extension : kImageExtensions) {
    size_t n = std::strlen(extension);
    if (lower.size() >= n && lower.compare(lower.size() - n, n, extension) == 0) return true;
  }
  return false;
}

namespace {

// One class folder's image files, in torchvision's order: os.walk's (root, dirs, files) tuples
// sorted, i.e. by root path string, and the files sorted within each.
std::vector<std::string> class_files(const std::string& folder) {
  std::vector<WalkedDirectory> walked;
  std::set<std::pair<dev_t, ino_t>> ancestors;
  walk(folder, ancestors, &walked);
  std::sort(walked.begin(), walked.end(),
            [](const WalkedDirectory& a, const WalkedDirectory& b) { return a.root < b.root; });
  std::vector<std::string> paths;
  for (WalkedDirectory& directory : walked) {
    std::sort(directory.files.begin(), directory.files.end());
    for (const std::string& name : directory.files)
      if (has_image_extension(name)) paths.push_back(join_path(directory.root, name));
  }
  return paths;
}

}  // namespace

Dataset Dataset::image_folder(const std::string& root) {
  struct stat info {};
  if (::stat(root.c_str(), &info) != 0) {
    throw Error("image folder '" + root +
                "' does not exist or cannot be read: " + std::strerror(errno));
  }
  if (!S_ISDIR(info.st_mode)) throw Error("image folder '" + root + "' is not a directory");
  DirectoryListing top;
  if (!list_directory(root, &top)) {
    throw Error("image folder '" + root + "' cannot be listed: " + std::strerror(errno));
  }
  Dataset dataset;
  dataset.classes_ = std::move(top.directories);
  // Python sorts str by code point; for UTF-8 names that is byte order, which std::string uses.
  std::sort(dataset.classes_.begin(), dataset.classes_.end());
  if (dataset.classes_.empty()) {
    throw Error("image folder '" + root + "' has no class folders (expected " + root +
                "/<class>/<image>, as torchvision's ImageFolder)");
  }
  // Class folders are walked on up to kScanThreads threads: an ImageNet-sized folder holds a
  // thousand, each listed by its own system calls (and, on a network file system, round trips);
  // each class's files keep torchvision's order and the classes theirs.
  const size_t classes = dataset.classes_.size();
  std::vector<std::vector<std::string>> files(classes);
  std::vector<std::exception_ptr> failures(classes);
  std::atomic<size_t> next{0};
  auto scan = [&] {
    for (size_t i = next++; i < classes; i = next++) {
      try {
        files[i] = class_files(join_path(root, dataset.classes_[i]));
      } catch (...) {
        failures[i] = std::current_exception();
      }
    }
  };
  const size_t threads =
      std::min<size_t>({classes, kScanThreads, std::max(1u, std::thread::hardware_concurrency())});
  std::vector<std::thread> helpers;
  try {
    for (size_t t = 1; t < threads; ++t) helpers.emplace_back(scan);
  } catch (const std::system_error&) {  // no more threads to be had: fewer scan it all
  }
  scan();
  for (std::thread& helper : helpers) helper.join();
  std::vector<std::string> empty_classes;
  for (size_t label = 0; label < classes; ++label) {
    if (failures[label]) std::rethrow_exception(failures[label]);
    if (files[label].empty()) empty_classes.push_back(dataset.classes_[label]);
    for (std::string& path : files[label])
      dataset.entries_.push_back(DatasetEntry{std::move(path), static_cast<int64_t>(label)});
  }
  if (!empty_classes.empty()) {
    std::string names;
    for (const std::string& name : empty_classes) names += (names.empty() ? "" : ", ") + name;
    throw Error("image folder '" + root + "': no image file in the class folders " + names +
                " (extensions: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp)");
  }
  return dataset;
}

Dataset Dataset::file_list(const std::string& list_file) {
  std::ifstream in(list_file);
  if (!in) {
    throw Error("file list '" + list_file + "' cannot be opened: " + std::strerror(errno));
  }
  const size_t slash = list_file.rfind('/');
  const std::string base = slash == std::string::npos ? "" : list_file.substr(0, slash + 1);
  Dataset dataset;
  std::string line;
  for (size_t line_number = 1; std::getline(in, line); ++line_number) {
    std::string text = trim(line);
    if (text.empty() || text.front() == '#') continue;
    const std::string where = list_file + ":" + std::to_string(line_number) + ": ";
    size_t split = text.find_last_of(" \t");
    if (split == std::string::npos) {
      throw Error(where + "expected '<path> <label>', got '" + text + "'");
    }
    std::string path = trim(text.substr(0, split));
    std::string label_text = text.substr(split + 1);
    errno = 0;
    char* end = nullptr;
    long long label = std::strtoll(label_text.c_str(), &end, 10);
    if (end == label_text.c_str() || *end != '\0' || errno == ERANGE) {
      throw Error(where + "label '" + label_text + "' is not an integer");
    }
    if (label < 0) throw Error(where + "label " + label_text + " is negative");
    dataset.entries_.push_back(DatasetEntry{join_path(base, path), static_cast<int64_t>(label)});
  }
  if (in.bad()) throw Error("file list '" + list_file + "': read error");
  if (dataset.entries_.empty()) throw Error("file list '" + list_file + "' lists no samples");
  return dataset;
}

}  // namespace batchcast
