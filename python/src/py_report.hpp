// python/src/py_report.hpp — def_report: a report struct (MemoryReport, StepReport, CommunicationCounts) as a Python class of read-only fields that prints them.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstddef>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace shardopt_python {

// One read-only field of a report struct, for def_report.
template <typename T, typename V>
struct ReportField {
  const char* name;
  V T::*member;
  const char* doc = nullptr;
};
template <typename T, typename V>
ReportField<T, V> field(const char* name, V T::*member, const char* doc = nullptr) {
  return {name, member, doc};
}

// Binds T as m.`name`: its fields as read-only properties, and a repr that lists them as a
// dataclass's does ("shardopt.MemoryReport(state_bytes=650000, ...)"), so that printing one
// shows its numbers.
template <typename T, typename... Values>
void def_report(nb::module_& m, const char* name, const char* doc, ReportField<T, Values>... fields) {
  nb::class_<T> cls(m, name, doc);
  const auto def = [&cls](const auto& f) {
    if (f.doc != nullptr) cls.def_ro(f.name, f.member, f.doc);
    else cls.def_ro(f.name, f.member);
  };
  (def(fields), ...);
  std::vector<std::string> names{fields.name...};
  cls.def("__repr__", [type = std::string(name), names](nb::handle self) {
    std::string text = "shardopt." + type + "(";
    for (std::size_t i = 0; i < names.size(); ++i) {
      text += (i > 0 ? ", " : "") + names[i] + "=" + nb::repr(self.attr(names[i].c_str())).c_str();
    }
    return text + ")";
  });
}

}  // namespace shardopt_python
