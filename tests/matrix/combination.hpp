// tests/matrix/combination.hpp — one line of combinations.txt (tools/feature_matrix.py writes it): the values of every dimension and what the test expects.
#pragma once

#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace shardopt_matrix {

struct Combination {
  std::string id;
  int np = 0;
  std::map<std::string, std::string> values;  // dimension -> value, as in the file
  // Empty: bitwise the reference, or refused at construction. Otherwise the signature of the
  // failure it is known to show today (the combination is marked known failing).
  std::string known_failure;
  // Non-empty: refused on every rank with an error containing this: by a constructor, or (when
  // refused_at_call) by the calls that meet the refused one (join()).
  std::string refusal;
  bool refused_at_call = false;
  std::string reason;  // why it is marked, from the generator

  const std::string& operator[](const std::string& dimension) const {
    const auto it = values.find(dimension);
    if (it == values.end()) throw std::runtime_error(id + ": no dimension '" + dimension + "' in combinations.txt");
    return it->second;
  }
  bool is(const std::string& dimension, const std::string& value) const { return (*this)[dimension] == value; }

  // The implementation dimensions at the reference's values: overlap off, stage 1, flat, no
  // node sharing.
  bool is_reference() const {
    return is("overlap", "off") && is("stage", "1") && is("partition", "flat") && is("nodes", "off");
  }

  // "c07 np=2 overlap=after_backward ..." for messages.
  std::string describe() const {
    std::string out = id + " np=" + std::to_string(np);
    for (const char* d : {"overlap", "stage", "partition", "nodes", "dtype", "local_sgd", "join", "mid_op", "lr_change", "algorithm", "state"}) {
      out += std::string(" ") + d + "=" + (*this)[d];
    }
    return out;
  }
};

// Every combination in `path`; lines starting with '#' are comments, ' # ' starts a reason.
inline std::vector<Combination> read_combinations(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::vector<Combination> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    Combination c;
    const std::size_t hash = line.find(" # ");
    if (hash != std::string::npos) {
      c.reason = line.substr(hash + 3);
      line.resize(hash);
    }
    std::istringstream fields(line);
    fields >> c.id;
    std::string field;
    while (fields >> field) {
      const std::size_t eq = field.find('=');
      if (eq == std::string::npos) throw std::runtime_error(path + ": field without '=' in " + c.id + ": " + field);
      c.values[field.substr(0, eq)] = field.substr(eq + 1);
    }
    c.np = std::stoi(c["np"]);
    const std::string& expect = c["expect"];
    const std::string known = "known_failing:";
    const std::string refused = "refused:";
    const std::string refused_at_call = "refused_at_call:";
    if (expect.rfind(known, 0) == 0) {
      c.known_failure = expect.substr(known.size());
    } else if (expect.rfind(refused, 0) == 0 || expect.rfind(refused_at_call, 0) == 0) {
      c.refused_at_call = expect.rfind(refused_at_call, 0) == 0;
      c.refusal = expect.substr((c.refused_at_call ? refused_at_call : refused).size());
      for (char& ch : c.refusal) ch = ch == '_' ? ' ' : ch;
    } else if (expect != "ok") {
      throw std::runtime_error(path + ": " + c.id + " expects '" + expect + "'");
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace shardopt_matrix
