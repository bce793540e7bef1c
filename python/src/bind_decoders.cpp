// Python bindings of decoders/: Dataset, make_dataset, ImagePipeline, its PipelineOptions and
// View (whose field list, decoders/view.h, makes PipelineOptions' attributes). Thin: every call that
// touches files or pixels releases the GIL; errors surface as the C++ exceptions' Python
// translations (messages name the file and the reason).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "decoders/dataset.h"
#include "decoders/image_pipeline.h"
#include "decoders/make_dataset.h"
#include "decoders/shrink_decode.h"
#include "decoders/view.h"
#include "python/src/bindings.h"
#include "python/src/settings_class.h"

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

py::tuple entry_tuple(const DatasetEntry& e) { return py::make_tuple(e.path, e.label); }

// The first index where `samples` ((path, label) pairs, a torchvision dataset's) differs from
// the entries, len(samples) if they only differ in length, -1 if equal. One C loop over the
// Python objects: an ImageNet-sized list is compared without making 1.28 M tuples.
int64_t first_difference(const Dataset& d, const py::sequence& samples) {
  const size_t n = static_cast<size_t>(py::len(samples));
  for (size_t i = 0; i < std::min(n, d.size()); ++i) {
    const py::object item = samples[i];
    if (!py::isinstance<py::sequence>(item)) return static_cast<int64_t>(i);
    const auto sample = item.cast<py::sequence>();
    try {
      if (py::len(sample) != 2 || sample[0].cast<std::string_view>() != d[i].path ||
          sample[1].cast<int64_t>() != d[i].label)
        return static_cast<int64_t>(i);
    } catch (const py::cast_error&) {  // not a (str, int) pair: not what the scan yields
      return static_cast<int64_t>(i);
    }
  }
  return n == d.size() ? -1 : static_cast<int64_t>(std::min(n, d.size()));
}

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
      .def_property_readonly("classes", &Dataset::classes)
      .def("first_difference", &first_difference, py::arg("samples"),
           "The first index where `samples` ((path, label) pairs) differs from the entries, "
           "len(samples) where only the lengths differ, -1 where they are equal.");

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

  SettingsClass<PipelineOptions> options(
      m, "PipelineOptions",
      "The transform (decoders/image_pipeline.h): what ImagePipeline and ServeConfig.transform "
      "take. Keyword construction; fields left out keep their defaults.");
  for_each_view_field([&](const ViewField& f, auto member, auto names) {
    options.declared(f.option, member, names, f.help);
  });
  options.field("max_image_pixels", &PipelineOptions::max_image_pixels,
                "decompression-bomb guard, checked from the header");
  options.finish();

  py::class_<View>(
      m, "View",
      "What a consumer makes of each decoded sample (docs/views.md; decoders/view.h): a transform "
      "and the seed of its draws, compared by value. Its text is its spelling on the wire.")
      .def(py::init<PipelineOptions>(), py::arg("options") = PipelineOptions{})
      .def_static("parse", py::overload_cast<const std::string&, const View&>(&View::parse),
                  py::arg("text"), py::arg("base") = View(),
                  "`text` (FIELD=VALUE,...) over `base`; raises BatchcastError naming the field.")
      .def_static("resolve", &View::resolve, py::arg("text"), py::arg("transform"),
                  "The view a Loader(view=`text`) reads from a server whose transform (its seed "
                  "the stream's) is `transform`.")
      .def_property_readonly("options", &View::options)
      .def("text", &View::text, py::arg("with_seed") = true,
           "The canonical text: every field, in the fields' order.")
      .def("__eq__", [](const View& a, const View& b) { return a == b; }, py::is_operator())
      .def("__hash__", [](const View& v) { return py::hash(py::str(v.text())); })
      .def("__repr__", [](const View& v) { return "View('" + v.text() + "')"; })
      .def_property_readonly_static("fields", [](const py::object&) {
        std::vector<std::string> names;
        for_each_view_field([&](const ViewField& f, auto, auto) { names.push_back(f.name); });
        return names;
      });

  py::class_<ImagePipeline>(m, "ImagePipeline",
                            "Decode + augment one image into a sample; thread-safe, deterministic "
                            "in (seed, epoch, index).")
      .def(py::init<PipelineOptions>(), py::arg("options") = PipelineOptions{})
      .def_property_readonly("options", [](const ImagePipeline& p) { return p.options(); })
      .def_property_readonly("sample_shape", &ImagePipeline::sample_shape)
      .def_property_readonly("sample_bytes", &ImagePipeline::sample_bytes)
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

  m.def(
      "decode_shrunk",
      [](const std::string& path, int side, int64_t max_image_pixels) {
        ScratchBuffer file;
        RgbView image;
        {
          py::gil_scoped_release release;
          const size_t size = read_image_file(path, file);
          image = decode_shrunk(file.data(), size, path, max_image_pixels, side);
        }
        py::array_t<uint8_t> out({image.height, image.width, 3});
        copy_packed(image, out.mutable_data());
        return out;
      },
      py::arg("path"), py::arg("side"),
      py::arg("max_image_pixels") = PipelineOptions{}.max_image_pixels,
      "The decoded cache's image of `path` (serve --cache decoded): decoded whole, its shorter "
      "side shrunk to at most `side`; uint8 (height, width, 3).");
}

}  // namespace batchcast::python
