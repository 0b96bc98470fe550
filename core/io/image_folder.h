// ImageNet-style image folders: root/<class>/.../<image>.{jpg,jpeg,png}, one sub-folder per class,
// scanned into a sorted list of (path, label) items.
#pragma once

#include <string>
#include <vector>

namespace kuafu::io {

struct ImageFolderIndex {
  std::vector<std::string> classes;  // label i is classes[i]
  struct Item {
    std::string path;
    int label;
  };
  std::vector<Item> items;  // by label, then by path within a class
};

// Classes are the sub-folders of `root` sorted by name (hidden ones, starting with '.', are ignored);
// a class's images are found recursively, extensions .jpg .jpeg .png in any case. Throws
// kuafu::Error for a missing root, no class folders, a class folder without images, or no images.
ImageFolderIndex scan_image_folder(const std::string& root);

// The same with a given class list (e.g. the training set's), so labels agree between splits. A
// sub-folder not in `classes` is an error naming it; classes absent from `root` are allowed.
ImageFolderIndex scan_image_folder(const std::string& root, const std::vector<std::string>& classes);

}  // namespace kuafu::io
