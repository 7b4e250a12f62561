// src/averaging/local_sgd_save_ids.hpp — the names of local-SGD saves inside a checkpoint directory, and the removal of older ones.
#pragma once

#include <cstdint>
#include <string>

namespace shardopt {
namespace averaging {

// The directory name of the save of `generation` with the random `token`.
std::string local_sgd_save_id(uint64_t generation, uint32_t token);

// Whether `name` is a save id as local_sgd_save_id writes it: "ls", the generation in at least
// six decimal digits, "-", the token in eight lower-case hex digits; nothing else.
bool is_local_sgd_save_id(const std::string& name);

// Removes the saves in `dir` other than `keep`: the entries whose names are save ids, and no
// other (a user's files beside them stay, whatever they are called). Errors are ignored: a
// save left over is harmless, the record names the one that counts.
void remove_older_saves(const std::string& dir, const std::string& keep);

}  // namespace averaging
}  // namespace shardopt
