// tests/checkpoint/corpus.hpp — the checkpoint mutation corpus: its two base checkpoints, the mutants, their expected refusals, and the generator.
//
// A mutant is a copy of a base checkpoint with one thing wrong: bit flips, truncations, hand
// edits of the manifest or of a shard file's header, overlapping tensors, overflowing sizes.
// Some edits recompute every checksum they touch (the shard file's CRC32C in the manifest and
// the manifest's own), so that they reach the deeper checks. Every mutant must be refused by
// verify and by load alike, with `code` and a message holding every one of `needles`. The
// generated corpus is checked in under tests/checkpoint/corpus (README.md there says how to
// regenerate it), and generated afresh by the tests.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt_models.hpp"
#include "shardopt/error.hpp"

namespace shardopt_test {

// A directory being mutated, with the edits the mutants make.
class CorpusDir;

struct Mutant {
  std::string name;  // its directory under mutants/
  std::string base;  // "adam" or "sgd"
  shardopt::ErrorCode code;
  std::vector<std::string> needles;
  std::string what;  // one line for the corpus index
  std::function<void(CorpusDir&)> apply;
};

// corpus_manifest_mutants.cpp and corpus_shard_mutants.cpp.
std::vector<Mutant> manifest_mutants();
std::vector<Mutant> shard_mutants();
std::vector<Mutant> all_mutants();

// The bases: "adam" (AdamW with amsgrad in group 0 and a frozen parameter, so shard file 0
// also holds frozen_params) and "sgd" (SGD with momentum and dampening). Both are trained three
// steps at one rank, saved, and resharded to two files ("adam" flat, "sgd" sorted_greedy).
const std::vector<std::string>& corpus_bases();
const std::vector<int64_t>& corpus_sizes();
// An optimizer registered as base `base` was (values from `model`), over `comm`.
std::unique_ptr<shardopt::ZeroOptimizer> make_corpus_optimizer(std::shared_ptr<shardopt::Communicator> comm,
                                                               const std::string& base, Model& model);

// Writes the corpus into `out` (emptied first): base-<name>/ for each base, mutants/<name>/ for
// each mutant, and INDEX (one line per mutant: name, base, expected error code, what). `solo`
// is a one-rank communicator of the calling process.
void generate_corpus(const std::string& out, std::shared_ptr<shardopt::Communicator> solo);

}  // namespace shardopt_test
