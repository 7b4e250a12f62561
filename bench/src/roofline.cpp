// bench/src/roofline.cpp — bytes per updated element for each update rule and dtype, and the verdict on a roofline fraction.
#include "roofline.hpp"

#include <fmt/format.h>

namespace shardopt_bench {

UpdateShape update_shape(const Options& o) {
  if (o.algorithm != Algorithm::sgd) return UpdateShape::adam;
  return o.momentum != 0.0 ? UpdateShape::sgd_momentum : UpdateShape::sgd;
}

int64_t update_bytes_per_param(UpdateShape shape, DType dtype) {
  const int64_t state = shape == UpdateShape::adam ? 16 : shape == UpdateShape::sgd_momentum ? 8 : 0;
  const int64_t param = dtype == DType::f32 ? 12 : 2 * static_cast<int64_t>(shardopt::dtype_size(dtype)) + 8;
  return param + state;
}

RooflineVerdict judge_roofline(double roofline_seconds, double measured_seconds, bool cache_resident) {
  RooflineVerdict v;
  v.fraction = measured_seconds > 0 ? roofline_seconds / measured_seconds : 0.0;
  if (cache_resident) v.status = RooflineStatus::cache_resident;
  else if (v.fraction > kRooflineTolerance) v.status = RooflineStatus::measurement_error;
  return v;
}

std::string format_fraction(const RooflineVerdict& verdict) {
  switch (verdict.status) {
    case RooflineStatus::ok: return fmt::format("{:.3f}", verdict.fraction);
    case RooflineStatus::cache_resident:
      return fmt::format("{:.3f} (cache-resident: not DRAM-bound, not judged)", verdict.fraction);
    case RooflineStatus::measurement_error:
      return fmt::format("{:.3f} (measurement error: above {:.2f})", verdict.fraction, kRooflineTolerance);
  }
  return "?";
}

const char* status_name(RooflineStatus status) {
  switch (status) {
    case RooflineStatus::ok: return "ok";
    case RooflineStatus::cache_resident: return "cache_resident";
    case RooflineStatus::measurement_error: return "measurement_error";
  }
  return "?";
}

}  // namespace shardopt_bench
