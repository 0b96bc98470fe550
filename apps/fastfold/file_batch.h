// Reading many files, skipping bad ones up to a limit (a data set of thousands of PDB files has some).
#pragma once

#include <string>
#include <vector>

#include "core/util/error.h"

namespace kuafu::fold {

// Reading many files: each path is read with `read`; a file that throws kuafu::Error is skipped
// while at most `max_bad_files` have been, its message kept; one more throws an Error counting them.
template <typename T>
struct FileBatch {
  std::vector<T> read;               // in the order of the paths, bad files left out
  std::vector<std::string> skipped;  // the error of each file skipped
};

template <typename T, typename Read>
FileBatch<T> read_files(const std::vector<std::string>& paths, size_t max_bad_files, Read read) {
  FileBatch<T> batch;
  for (size_t i = 0; i < paths.size(); ++i) {
    try {
      batch.read.push_back(read(paths[i]));
    } catch (const Error& e) {
      batch.skipped.push_back(e.what());
      if (batch.skipped.size() > max_bad_files) {
        std::string message = detail::concat(batch.skipped.size(), " bad files among the first ", i + 1, " of ",
                                             paths.size(), ", more than max_bad_files = ", max_bad_files, ":");
        for (const std::string& error : batch.skipped) message += "\n  " + error;
        throw Error(message);
      }
    }
  }
  return batch;
}

}  // namespace kuafu::fold
