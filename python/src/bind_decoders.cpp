// Python bindings of decoders/: Dataset, make_dataset and ImagePipeline. Thin: every call that
// touches files or pixels releases the GIL; errors surface as the C++ exceptions' Python
// translations (messages name the file and the reason).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "decoders/make_dataset.h"
#include "python/src/bindings.h"

namespace py = pybind11;

namespace batchcast::python {
namespace {

// NumPy has no bfloat16: bfloat16 samples come back as uint16 bit patterns
// (torch.from_numpy(a).view(torch.bfloat16) reinterprets them).
py::dtype numpy_dtype(DType type) {
  switch (type) {
    case DType::kFloat16:
      return py::dtype("float16");
    case DType::kBFloat16:
      return py::dtype::of<uint16_t>();
    case DType::kUInt8:
      return py::dtype::of<uint8_t>();
    default:  // kFloat32: the pipeline writes nothing else (kOutputDTypes)
      return py::dtype::of<float>();
  }
}

py::array new_sample(const ImagePipeline& pipeline) {
  return py::array(numpy_dtype(pipeline.options().output), pipeline.sample_shape());
}

// The enum named `name` in `names`; ValueError listing the valid names otherwise.
template <typename T>
T parse_name(const std::string& name, const std::map<std::string, T>& names, const char* what) {
  auto it = names.find(name);
  if (it != names.end()) return it->second;
  std::string valid;
  for (const auto& [key, value] : names) valid += (valid.empty() ? "" : ", ") + key;
  throw py::value_error(std::string(what) + " '" + name + "' is not one of " + valid);
}

py::tuple entry_tuple(const DatasetEntry& e) { return py::make_tuple(e.path, e.label); }

}  // namespace

void bind_decoders(py::module_& m) {
  py::class_<Dataset>(m, "Dataset",
                      "Ordered (path, label) samples: ImageFolder (torchvision order) or a list "
                      "file of 'path label' lines.")
      .def_static("image_folder", &Dataset::image_folder, py::arg("root"),
                  py::call_guard<py::gil_scoped_release>())
      .def_static("file_list", &Dataset::file_list, py::arg("list_file"),
                  py::call_guard<py::gil_scoped_release>())
      .def("__len__", &Dataset::size)
      .def("__getitem__",
           [](const Dataset& d, int64_t i) {
             const int64_t n = static_cast<int64_t>(d.size());
             if (i < 0) i += n;
             if (i < 0 || i >= n) throw py::index_error("Dataset index out of range");
             return entry_tuple(d[static_cast<size_t>(i)]);
           })
      .def_property_readonly("entries",
                             [](const Dataset& d) {
                               py::list out;
                               for (const DatasetEntry& e : d.entries()) out.append(entry_tuple(e));
                               return out;
                             })
      .def_property_readonly("classes", &Dataset::classes);

  m.def(
      "make_dataset",
      [](const std::string& out_dir, const std::string& source_dir, int classes,
         int images_per_class, uint64_t seed) {
        MakeDatasetOptions options;
        options.out_dir = out_dir;
        options.source_dir = source_dir;
        options.classes = classes;
        options.images_per_class = images_per_class;
        options.seed = seed;
        MakeDatasetReport report;
        {
          py::gil_scoped_release release;
          report = make_dataset(options);
        }
        py::dict out;
        out["images"] = report.images;
        out["bytes"] = report.bytes;
        out["classes"] = report.classes;
        out["sources"] = report.sources;
        return out;
      },
      py::arg("out_dir"), py::arg("source_dir") = MakeDatasetOptions{}.source_dir,
      py::arg("classes") = 10, py::arg("images_per_class") = 40, py::arg("seed") = 0,
      "Write an ImageFolder of ImageNet-like JPEGs cut from real photos; returns a report dict.");

  const PipelineOptions defaults;
  py::class_<ImagePipeline>(m, "ImagePipeline",
                            "Decode + augment one image into a sample; thread-safe, deterministic "
                            "in (seed, epoch, index).")
      .def(py::init([](int image_size, bool train, const std::string& output,
                       std::array<float, 3> mean, std::array<float, 3> std, uint64_t seed,
                       int64_t max_image_pixels, std::array<double, 2> scale,
                       std::array<double, 2> ratio, double flip_p, int resize_size,
                       const std::string& interpolation, const std::string& uint8_layout) {
             PipelineOptions options;
             options.image_size = image_size;
             options.train = train;
             options.output = parse_dtype(output, kOutputDTypes);
             options.mean = mean;
             options.std = std;
             options.seed = seed;
             options.max_image_pixels = max_image_pixels;
             options.scale = scale;
             options.ratio = ratio;
             options.flip_p = flip_p;
             options.resize_size = resize_size;
             options.interpolation =
                 parse_name(interpolation, kInterpolationNames, "interpolation");
             options.uint8_layout = parse_name(uint8_layout, kUint8LayoutNames, "uint8_layout");
             return ImagePipeline(options);
           }),
           py::arg("image_size") = defaults.image_size, py::arg("train") = defaults.train,
           py::arg("output") = "float32", py::arg("mean") = defaults.mean,
           py::arg("std") = defaults.std, py::arg("seed") = defaults.seed,
           py::arg("max_image_pixels") = defaults.max_image_pixels,
           py::arg("scale") = defaults.scale, py::arg("ratio") = defaults.ratio,
           py::arg("flip_p") = defaults.flip_p, py::arg("resize_size") = defaults.resize_size,
           py::arg("interpolation") = "bilinear", py::arg("uint8_layout") = "hwc")
      .def(
          "geometry",
          [](const ImagePipeline& p, int width, int height, uint64_t epoch, uint64_t index) {
            const SampleGeometry g = p.geometry(width, height, false, epoch, index, "<geometry>");
            py::dict d;
            d["crop"] = py::make_tuple(g.crop.left, g.crop.top, g.crop.width, g.crop.height);
            d["resize"] = py::make_tuple(g.resize_w, g.resize_h);
            d["final"] = py::make_tuple(g.final_left, g.final_top);
            d["flip"] = g.flip;
            return d;
          },
          py::arg("width"), py::arg("height"), py::arg("epoch") = 0, py::arg("index") = 0,
          "Inspection: what the pipeline does to sample (epoch, index) of a width x height image "
          "(crop box (left, top, width, height) in source pixels, resize (w, h), final crop "
          "(left, top), flip), the same draw process() makes.")
      .def(
          "process",
          [](const ImagePipeline& p, const std::string& path, uint64_t epoch, uint64_t index) {
            py::array out = new_sample(p);
            void* data = out.mutable_data();
            py::gil_scoped_release release;
            p.process(path, epoch, index, data);
            return out;
          },
          py::arg("path"), py::arg("epoch") = 0, py::arg("index") = 0,
          "Decode and augment `path`; returns a new array of the sample's shape.")
      .def(
          "process_into",
          [](const ImagePipeline& p, const std::string& path, uint64_t epoch, uint64_t index,
             py::array out) {
            if (!(out.flags() & py::array::c_style) || !out.writeable() ||
                static_cast<size_t>(out.nbytes()) != p.sample_bytes()) {
              throw py::value_error("out must be a writable C-contiguous array of " +
                                    std::to_string(p.sample_bytes()) + " bytes");
            }
            void* data = out.mutable_data();
            py::gil_scoped_release release;
            p.process(path, epoch, index, data);
          },
          py::arg("path"), py::arg("epoch"), py::arg("index"), py::arg("out"),
          "Decode and augment `path` into `out` (e.g. one row of a preallocated batch).")
      .def(
          "process_bytes",
          [](const ImagePipeline& p, py::bytes data, const std::string& name, uint64_t epoch,
             uint64_t index) {
            std::string_view bytes = data;
            py::array out = new_sample(p);
            void* target = out.mutable_data();
            py::gil_scoped_release release;
            p.process_bytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name,
                            epoch, index, target);
            return out;
          },
          py::arg("data"), py::arg("name") = "<bytes>", py::arg("epoch") = 0, py::arg("index") = 0);
}

}  // namespace batchcast::python
