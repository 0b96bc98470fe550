// ImageNet-style image folders: root/<class>/.../<image>.{jpg,jpeg,png}, one sub-folder per class,
// scanned into a sorted list of (path, label, caption) items.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace kuafu::io {

struct ImageFolderIndex {
  std::vector<std::string> classes;  // label i is classes[i]
  struct Item {
    std::string path;
    int label;
    std::optional<std::string> caption;  // <image>.txt beside the image (a.png: a.txt), trimmed
  };
  std::vector<Item> items;  // by label, then by path within a class
};

// The class names of `root`: its sub-folders sorted by name, hidden ones (starting with '.') ignored.
// Throws kuafu::Error for a missing root or no class folders.
std::vector<std::string> image_folder_classes(const std::string& root);

// Classes are the sub-folders of `root` sorted by name (hidden ones, starting with '.', are ignored);
// a class's images are found recursively, extensions .jpg .jpeg .png in any case, each with the text
// of a caption file beside it when there is one (unreadable: an error naming it). Throws
// kuafu::Error for a missing root, no class folders, a class folder without images, or no images.
ImageFolderIndex scan_image_folder(const std::string& root);

// The same with a given class list (e.g. the training set's), so labels agree between splits. A
// sub-folder not in `classes` is an error naming it; classes absent from `root` are allowed.
ImageFolderIndex scan_image_folder(const std::string& root, const std::vector<std::string>& classes);

}  // namespace kuafu::io
