#include "core/io/sentencepiece_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "core/util/error.h"

#ifndef KUAFU_SPM_BRIDGE_NAME
#define KUAFU_SPM_BRIDGE_NAME "libkuafu_spm_bridge.so"
#endif

namespace kuafu::io {

namespace {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string executable_dir() {
  std::string path(4096, '\0');
  const ssize_t size = ::readlink("/proc/self/exe", path.data(), path.size());
  if (size <= 0 || static_cast<size_t>(size) >= path.size()) return "";
  path.resize(static_cast<size_t>(size));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::vector<std::string> candidate_paths() {
  if (const char* env = std::getenv("KUAFU_SPM_BRIDGE"); env != nullptr && *env != '\0') return {env};
  std::vector<std::string> paths;
  if (const std::string dir = executable_dir(); !dir.empty()) {
    paths.push_back(dir + "/" KUAFU_SPM_BRIDGE_NAME);
    paths.push_back(dir + "/../lib/" KUAFU_SPM_BRIDGE_NAME);
  }
#ifdef KUAFU_SPM_BRIDGE_PATH
  paths.push_back(KUAFU_SPM_BRIDGE_PATH);
#endif
  return paths;
}

// Opens one candidate; on failure returns nullptr and says why in `why`.
const KuafuSpmApi* try_open(const std::string& path, std::string& why) {
  if (!file_exists(path)) {
    why = "no such file";
    return nullptr;
  }
  // RTLD_LOCAL keeps SentencePiece's bundled protobuf out of the global scope, where it would
  // interpose on LibTorch's libprotobuf; RTLD_DEEPBIND makes SentencePiece's own references bind to
  // its bundled copy rather than to an already loaded libprotobuf.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
  if (handle == nullptr) {
    const char* error = ::dlerror();
    why = error != nullptr ? error : "dlopen failed";
    return nullptr;
  }
  const auto entry = reinterpret_cast<KuafuSpmApiEntry>(::dlsym(handle, KUAFU_SPM_API_SYMBOL));
  const KuafuSpmApi* api = entry != nullptr ? entry(KUAFU_SPM_API_VERSION) : nullptr;
  if (api == nullptr || api->struct_size < sizeof(KuafuSpmApi)) {
    why = entry == nullptr ? "no " KUAFU_SPM_API_SYMBOL " symbol (not a Kuafu bridge?)"
                           : "wrong bridge version (stale build?)";
    ::dlclose(handle);
    return nullptr;
  }
  return api;  // the handle stays open for the life of the process
}

const KuafuSpmApi& load_bridge() {
  const std::vector<std::string> paths = candidate_paths();
  std::string tried;
  for (const std::string& path : paths) {
    std::string why;
    if (const KuafuSpmApi* api = try_open(path, why)) return *api;
    tried += "\n  " + path + ": " + why;
  }
  fail("cannot load the SentencePiece bridge " KUAFU_SPM_BRIDGE_NAME "; tried:" +
       (tried.empty() ? std::string(" nothing") : tried) +
       "\nbuild the kuafu_spm_bridge target or set KUAFU_SPM_BRIDGE to its path");
}

}  // namespace

const KuafuSpmApi& sentencepiece_bridge() {
  static const KuafuSpmApi& api = load_bridge();
  return api;
}

}  // namespace kuafu::io
