#include "core/io/image_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <set>

#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"
#include "core/util/utf8.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

std::string lower_extension(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext;
}

bool is_image(const fs::path& path) {
  const std::string ext = lower_extension(path);
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// Sub-folder names of root, sorted; hidden folders (".git", ".ipynb_checkpoints") are not classes.
std::vector<std::string> class_folders(const std::string& root) {
  KUAFU_CHECK(fs::exists(root), "image folder ", root, " does not exist");
  KUAFU_CHECK(fs::is_directory(root), "image folder ", root, " is not a directory");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name[0] != '.') names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  KUAFU_CHECK(!names.empty(), "image folder ", root, " has no class sub-folders (expected ", root,
              "/<class>/<image>.jpg)");
  return names;
}

// The images under one class folder, sorted by path, each with its caption file's text when it has one.
std::vector<ImageFolderIndex::Item> class_images(const fs::path& folder, int label) {
  std::vector<ImageFolderIndex::Item> images;
  std::set<fs::path> captions;  // the .txt files seen, so that finding an image's caption costs no lookup
  const auto options = fs::directory_options::follow_directory_symlink;
  for (const auto& entry : fs::recursive_directory_iterator(folder, options)) {
    if (!entry.is_regular_file()) continue;
    if (is_image(entry.path())) images.push_back({entry.path().string(), label, std::nullopt});
    if (lower_extension(entry.path()) == ".txt") captions.insert(entry.path());
  }
  std::sort(images.begin(), images.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  for (auto& image : images) {
    const fs::path caption = fs::path(image.path).replace_extension(".txt");
    if (captions.count(caption)) {
      image.caption = text::trim(read_file(caption.string()));
      // Checked here, so that a bad file is named before training rather than by the tokenizer mid-run.
      KUAFU_CHECK(text::replace_invalid_utf8(*image.caption) == *image.caption, caption.string(),
                  " is not UTF-8 text (captions are read as UTF-8)");
    }
  }
  return images;
}

ImageFolderIndex scan(const std::string& root, const std::vector<std::string>& classes) {
  std::map<std::string, int> label_of;
  for (size_t i = 0; i < classes.size(); ++i) label_of.emplace(classes[i], static_cast<int>(i));
  KUAFU_CHECK(label_of.size() == classes.size(), "image folder ", root, ": the class list has duplicate names");

  ImageFolderIndex index;
  index.classes = classes;
  // Labels ascend with the class list's order, not the folder names', when the two differ.
  std::vector<std::pair<int, std::string>> present;
  for (const std::string& name : class_folders(root)) {
    const auto it = label_of.find(name);
    KUAFU_CHECK(it != label_of.end(), "image folder ", root, ": class folder '", name, "' is not among the ",
                classes.size(), " classes given (those of the training set)");
    present.emplace_back(it->second, name);
  }
  std::sort(present.begin(), present.end());
  std::string empty_class;  // an empty class folder usually means a failed copy or extraction
  for (const auto& [label, name] : present) {
    std::vector<ImageFolderIndex::Item> images = class_images(fs::path(root) / name, label);
    if (images.empty() && empty_class.empty()) empty_class = name;
    for (auto& image : images) index.items.push_back(std::move(image));
  }
  KUAFU_CHECK(!index.items.empty(), "image folder ", root, " has no .jpg/.jpeg/.png images in its ", present.size(),
              " class folders");
  KUAFU_CHECK(empty_class.empty(), "image folder ", root, ": class folder '", empty_class,
              "' has no .jpg/.jpeg/.png images");
  return index;
}

// Unreadable folders (permissions, broken links) surface as kuafu::Error like every other problem.
template <typename Scan>
auto guarded(const std::string& root, Scan&& scan_fn) {
  try {
    return scan_fn();
  } catch (const fs::filesystem_error& e) {
    fail(detail::concat("image folder ", root, ": ", e.what()));
  }
}

}  // namespace

std::vector<std::string> image_folder_classes(const std::string& root) {
  return guarded(root, [&] { return class_folders(root); });
}

ImageFolderIndex scan_image_folder(const std::string& root) {
  return guarded(root, [&] { return scan(root, class_folders(root)); });
}

ImageFolderIndex scan_image_folder(const std::string& root, const std::vector<std::string>& classes) {
  return guarded(root, [&] { return scan(root, classes); });
}

}  // namespace kuafu::io
