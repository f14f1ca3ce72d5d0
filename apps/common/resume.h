// apps: resuming must not change what the run means. A checkpoint's description records the settings that shape the
// data stream, the optimizer or the schedule (batch size, seed, learning rate, ...); resuming with another value of one
// of them is an error naming the flag and both values, and a data position or step that does not fit the flags is an
// error too. The flags that may change on resume are listed in docs/CHECKPOINTS.md ("Resuming").
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace weft::apps {

// The summation order a checkpoint was trained with (its "virtual_batches": 0 without --deterministic) must be
// this run's, or every later step's bits differ: the error says which flags resume it.
void check_resumed_determinism(const std::map<std::string, std::string>& app, int64_t virtual_batches,
                               const std::string& where, const std::string& program);

// Throws weft::Error "<program>: <where> was written with <flag> <recorded> but <flag> is <value>:
// <why>; pass <flag> <recorded> to resume it" when `app` records `key` with a value other than
// `value`. A key the checkpoint lacks (written by an older weft) is not checked.
void check_resumed_setting(const std::map<std::string, std::string>& app, const std::string& key,
                           const std::string& flag, const std::string& value, const std::string& why,
                           const std::string& where, const std::string& program);

// The data a run resumes on must be the data the checkpoint was trained on: each of `now`'s keys (e.g. train_bytes and
// train_sha256) must have the checkpoint's value; keys the checkpoint lacks (written by an older weft) are not checked.
// Throws "<program>: <where> was written with a <what> of <recorded> but <source> gives <now>: ..." otherwise.
void check_resumed_data(const std::map<std::string, std::string>& app, const std::map<std::string, std::string>& now,
                        const std::string& what, const std::string& source, const std::string& where,
                        const std::string& program);

// The data position `key` of a checkpoint, which must lie in [lo, hi]; throws naming the
// checkpoint, the key and the range otherwise (a missing key as well).
int64_t data_position(const std::map<std::string, int64_t>& data, const std::string& key, int64_t lo, int64_t hi,
                      const std::string& where, const std::string& program);

// The checkpoint `path` names (fsdp::latest_checkpoint: itself, or the newest readable step under it); "" when there is
// none. Newer steps whose index cannot be read are passed over, and when `say` the program says on stderr which it
// passes over (and why) and which it uses; when none can be read, the newest's error is thrown. Not `fall_back` (a
// command writing a result from it: export, consolidate, sample, eval), such a newer step is an error naming both.
std::string readable_checkpoint(const std::string& path, const std::string& program, bool say, bool fall_back = true);

// A checkpoint directory given by `flag` must be a directory or not exist yet (it is made on the
// first save): a file, FIFO or device there is an error at start-up, not after training.
void check_checkpoint_dir(const std::string& dir, const std::string& flag, const std::string& program);

}  // namespace weft::apps
