// src/checkpoint/optimizer_parts.cpp — checks shared by checkpoint loads and saves: state kind names, same model.
#include "checkpoint/optimizer_parts.hpp"

#include <fmt/ranges.h>

#include "core/check.hpp"

namespace shardopt {
namespace checkpoint {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  return shape.empty() ? "" : fmt::format(", shape [{}]", fmt::join(shape, ", "));
}
std::string describe_saved(const ManifestParam& p) {
  return fmt::format("'{}' (numel {}{}, {}, group {})", p.name, p.numel, shape_text(p.shape), dtype_name(p.dtype),
                     p.group);
}
std::string describe_here(const optim::ParamRecord& p) {
  return fmt::format("'{}' (numel {}{}, {}, group {})", p.name, p.numel, shape_text(p.shape), dtype_name(p.dtype),
                     p.group);
}

}  // namespace

std::vector<std::string> state_kind_names(const optim::StateMask& kinds) {
  std::vector<std::string> names;
  for (std::size_t k = 0; k < optim::kStateKinds; ++k) {
    if (kinds[k]) names.push_back(optim::kStateNames[k]);
  }
  return names;
}

void check_same_model(const optim::ParamTable& table, const Manifest& manifest, const std::string& source) {
  const std::vector<optim::ParamRecord>& params = table.params();
  const std::size_t num_groups = table.groups().size();
  for (std::size_t g = 0; g < std::min(num_groups, manifest.groups.size()); ++g) {
    const Algorithm saved = group_algorithm(manifest, g);
    const Algorithm here = table.algorithm(static_cast<int>(g));
    SHARDOPT_CHECK(saved == here, mismatch, "{} was saved with param group {} running {}; here it runs {}", source, g,
                   algorithm_name(saved), algorithm_name(here));
  }
  const std::size_t common = std::min(manifest.params.size(), params.size());
  for (std::size_t i = 0; i < common; ++i) {
    const ManifestParam& saved = manifest.params[i];
    const optim::ParamRecord& here = params[i];
    SHARDOPT_CHECK(saved.name == here.name && saved.numel == here.numel && saved.dtype == here.dtype &&
                       saved.group == here.group && saved.shape == here.shape,
                   mismatch, "{} is of another model: parameter #{} is {} in the checkpoint but {} here", source, i,
                   describe_saved(saved), describe_here(here));
  }
  SHARDOPT_CHECK(manifest.params.size() == params.size(), mismatch,
                 "{} is of another model: it holds {} parameters, {} are registered (first unmatched: {})", source,
                 manifest.params.size(), params.size(),
                 manifest.params.size() > common ? describe_saved(manifest.params[common]) + " in the checkpoint"
                                                 : describe_here(params[common]) + " here");
  SHARDOPT_CHECK(manifest.groups.size() == num_groups, mismatch, "{} has {} param groups, this optimizer {}", source,
                 manifest.groups.size(), num_groups);
}

}  // namespace checkpoint
}  // namespace shardopt
