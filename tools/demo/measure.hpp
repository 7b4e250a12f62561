// tools/demo/measure.hpp — what shardopt-demo measures of a run: peak RSS per mode and the median step time.
#pragma once

#include <vector>

namespace shardopt_demo {

// Peak RSS is a per-process high-water mark that only grows. To give each mode its own number
// we hand freed memory back to the kernel between modes and reset the mark (Linux >= 4.0:
// writing "5" to /proc/self/clear_refs sets VmHWM to the current RSS). Returns false when the
// reset is not possible; the reported peak is then the process-lifetime peak (ru_maxrss).
bool reset_peak_rss();

// This process's peak RSS in MiB since the last reset_peak_rss() (or its lifetime peak).
double peak_rss_mib();

double median(std::vector<double> values);

}  // namespace shardopt_demo
