// core: crash-safe file replacement, for checkpoints and anything else a reader must never see half-written.
#pragma once
#include <cstdio>
#include <functional>
#include <string>

namespace weft {

// Writes a file so that readers see either the old complete file or the new complete one: a temp file in the same
// directory (so the rename stays on one filesystem), written by `write`, flushed and fsync'ed, renamed over `path`,
// then the directory fsync'ed so the rename itself survives a crash. On any failure before the rename (including an
// exception from `write`) the temp file is removed and `path` is untouched. Errors are weft::Error naming the path and
// strerror(errno). `write` should check its own writes; a stream error it leaves behind is caught here too. First
// removes what writes to `path` by processes now gone from this host left (killed before their rename). Not `replace`:
// a file at `path` by then (made after the caller checked) stays, and the write fails naming it.
void write_file_atomic(const std::string& path, const std::function<void(std::FILE*)>& write, bool replace = true);

// Whether `pid`, the digits a temporary name carries, names no process on this host (kill(pid, 0): ESRCH).
bool temp_owner_gone(const std::string& pid);

// fsync of a directory, so that entries created, renamed or removed in it survive a crash
// (a filesystem that cannot sync directories, EINVAL, is accepted). weft::Error naming `dir`.
void fsync_directory(const std::string& dir);

}  // namespace weft
