// SettingsClass: a plain settings struct (PipelineOptions, ServeConfig, ConsumerOptions,
// StreamHostOptions) bound as a typed Python class. Each field is a read-write attribute (enums
// as their names, checked on assignment; errors name the field as the command line does for the
// serve settings, as the keyword does for the others); keyword construction, ==, repr, pickling
// and the class attribute `fields` (the names, as declared: what tests/python/test_stub.py holds
// the stub to) all come from that one list of fields, so a field added to the binding is added
// to all of them.
//
// Thread-safety: used while the module is initialised (GIL held). The bound objects are
// values: each Python object owns its own T.
#pragma once

#include <pybind11/pybind11.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "common/named.h"

namespace batchcast::python {

// How errors name a field: as `batchcast serve`'s option (the field without its dashes), or as
// the Python keyword (settings that no command line has).
enum class FieldNames { kServeFlags, kKeywords };

// The enum named `value` in `names`, for the field `field`; otherwise Error naming the field and
// the valid names: "--decoder: gpu not in {cpu,...} (batchcast serve --help)", or
// "late_join='first' not in {next_epoch,replay}".
template <typename T>
T parse_name(const std::string& value, const std::map<std::string, T>& names, const char* field,
             FieldNames spelling) {
  auto it = names.find(value);
  if (it != names.end()) return it->second;
  const std::string valid = names_joined(names, ",");
  if (spelling == FieldNames::kKeywords)
    throw Error(std::string(field) + "='" + value + "' not in {" + valid + "}");
  std::string flag = std::string("--") + field;
  std::replace(flag.begin(), flag.end(), '_', '-');
  throw Error(flag + ": " + value + " not in {" + valid + "} (batchcast serve --help)");
}

template <typename T>
class SettingsClass {
 public:
  SettingsClass(pybind11::module_& m, const char* name, const char* doc,
                FieldNames spelling = FieldNames::kServeFlags)
      : cls_(m, name, doc),
        names_(std::make_shared<std::vector<std::string>>()),
        spelling_(spelling) {}

  template <typename F>
  SettingsClass& field(const char* name, F T::*member, const char* doc) {
    cls_.def_readwrite(name, member, doc);
    names_->push_back(name);
    return *this;
  }
  // An enum field, as a str among `names` (the command line's table).
  template <typename E>
  SettingsClass& named(const char* name, E T::*member, const std::map<std::string, E>& names,
                       const char* doc) {
    const std::map<std::string, E>* table = &names;  // the tables are static
    cls_.def_property(
        name, [member, table](const T& t) { return name_of(t.*member, *table).value_or("?"); },
        [member, table, name, spelling = spelling_](T& t, const std::string& v) {
          t.*member = parse_name(v, *table, name, spelling);
        },
        doc);
    names_->push_back(name);
    return *this;
  }

  // A field of a declared list (for_each_serve_setting, for_each_view_field): an enum by the
  // names of its table, any other type as itself (`names` is then unused: a bool's names are
  // the view text's, not Python's).
  template <typename F, typename Names>
  SettingsClass& declared(const char* name, F T::*member, const Names* names, const char* doc) {
    if constexpr (std::is_enum_v<F>)
      return named(name, member, *names, doc);
    else
      return field(name, member, doc);
  }

  // A field read and written through `get` and `set` (which checks the value).
  template <typename Get, typename Set>
  SettingsClass& property(const char* name, Get get, Set set, const char* doc) {
    cls_.def_property(name, get, set, doc);
    names_->push_back(name);
    return *this;
  }

  // Adds __init__(**fields), __eq__, __repr__, pickling and `fields`; returns the class for
  // further defs.
  pybind11::class_<T>& finish() {
    namespace py = pybind11;
    auto names = names_;
    py::tuple listed(names->size());
    for (size_t i = 0; i < names->size(); ++i) listed[i] = py::str((*names)[i]);
    cls_.attr("fields") = listed;
    auto build = [names](const py::dict& fields) {
      py::object obj = py::cast(T{});
      for (auto [key, value] : fields) {
        const std::string k = py::str(key);
        if (std::find(names->begin(), names->end(), k) == names->end())
          throw py::type_error(std::string(py::str(py::type::handle_of(obj).attr("__name__"))) +
                               " has no field '" + k + "'");
        obj.attr(key) = value;
      }
      return obj.cast<T>();
    };
    auto state = [names](const py::object& self) {
      py::dict d;
      for (const std::string& n : *names) d[n.c_str()] = self.attr(n.c_str());
      return d;
    };
    cls_.def(py::init([build](const py::kwargs& kw) { return build(kw); }))
        .def("__eq__",
             [state](const py::object& a, const py::object& b) {
               return py::isinstance(b, a.get_type()) && state(a).equal(state(b));
             })
        .def("__repr__",
             [state](const py::object& self) {
               std::string out = py::str(self.get_type().attr("__name__"));
               std::string sep = "(";
               for (auto [k, v] : state(self)) {
                 out += sep + std::string(py::str(k)) + "=" + std::string(py::repr(v));
                 sep = ", ";
               }
               return out + ")";
             })
        .def(py::pickle(state, [build](const py::dict& d) { return build(d); }));
    return cls_;
  }

 private:
  pybind11::class_<T> cls_;
  std::shared_ptr<std::vector<std::string>> names_;
  FieldNames spelling_;
};

}  // namespace batchcast::python
