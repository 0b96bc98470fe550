#include "core/io/hdf5_images.h"

#include <H5Cpp.h>

#include <algorithm>
#include <filesystem>

#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::io {
namespace {

const char* class_name(H5T_class_t type_class) {
  switch (type_class) {
    case H5T_INTEGER: return "integer";
    case H5T_FLOAT: return "float";
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    default: return "non-numeric";
  }
}

std::vector<hsize_t> dims_of(const H5::DataSet& dataset) {
  const H5::DataSpace space = dataset.getSpace();
  std::vector<hsize_t> dims(static_cast<size_t>(space.getSimpleExtentNdims()));
  space.getSimpleExtentDims(dims.data());
  return dims;
}

bool has_dataset(const H5::H5File& file, const std::string& name) {
  try {
    return file.nameExists(name);
  } catch (const H5::Exception&) {
    return false;  // a missing parent group in "group/name" throws instead of answering false
  }
}

H5::DataSet open_dataset(const H5::H5File& file, const std::string& path, const std::string& name) {
  KUAFU_CHECK(has_dataset(file, name), "HDF5 file ", path, " has no dataset '", name, "'");
  try {
    return file.openDataSet(name);
  } catch (const H5::Exception& e) {
    fail(detail::concat("HDF5 file ", path, ": '", name, "' is not a readable dataset (", e.getDetailMsg(), ")"));
  }
}

// The `count` strings of dataset `name` [count], fixed- or variable-length, each trimmed.
std::vector<std::string> read_strings(const H5::H5File& file, const std::string& path, const std::string& name,
                                      hsize_t count) {
  const H5::DataSet dataset = open_dataset(file, path, name);
  const H5T_class_t type_class = dataset.getDataType().getClass();
  KUAFU_CHECK(type_class == H5T_STRING, "HDF5 file ", path, ": dataset '", name, "' must hold strings, found ",
              class_name(type_class), " values");
  const std::vector<hsize_t> dims = dims_of(dataset);
  KUAFU_CHECK(dims.size() == 1, "HDF5 file ", path, ": dataset '", name, "' must have rank 1 [N], found rank ",
              dims.size());
  KUAFU_CHECK(dims[0] == count, "HDF5 file ", path, ": dataset '", name, "' has ", dims[0], " captions but the file has ",
              count, " images");
  std::vector<std::string> strings(static_cast<size_t>(count));
  if (count == 0) return strings;
  const H5::StrType stored = dataset.getStrType();
  if (stored.isVariableStr()) {
    H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
    type.setCset(stored.getCset());
    std::vector<char*> raw(strings.size(), nullptr);
    dataset.read(raw.data(), type);
    for (size_t i = 0; i < raw.size(); ++i) strings[i] = text::trim(raw[i] == nullptr ? "" : raw[i]);
    H5::DataSet::vlenReclaim(raw.data(), type, dataset.getSpace());
  } else {
    const size_t size = stored.getSize();  // padded with NULs or spaces
    std::vector<char> raw(strings.size() * size);
    dataset.read(raw.data(), stored);
    for (size_t i = 0; i < strings.size(); ++i) {
      const char* begin = raw.data() + i * size;
      strings[i] = text::trim(std::string(begin, std::find(begin, begin + size, '\0')));
    }
  }
  return strings;
}

ImageArray read(const H5::H5File& file, const std::string& path, const std::string& images_name,
                const std::string& labels_name, const std::string& captions_name) {
  const H5::DataSet images = open_dataset(file, path, images_name);
  const H5::DataType image_type = images.getDataType();
  const bool uint8 = image_type.getClass() == H5T_INTEGER && image_type.getSize() == 1 &&
                     images.getIntType().getSign() == H5T_SGN_NONE;
  KUAFU_CHECK(uint8, "HDF5 file ", path, ": dataset '", images_name, "' must hold uint8 pixels, found ",
              image_type.getSize(), "-byte ", class_name(image_type.getClass()), " values");
  const std::vector<hsize_t> dims = dims_of(images);
  KUAFU_CHECK(dims.size() == 3 || dims.size() == 4, "HDF5 file ", path, ": dataset '", images_name,
              "' must have rank 3 [N, H, W] or 4 [N, H, W, C], found rank ", dims.size());

  const H5::DataSet labels = open_dataset(file, path, labels_name);
  const H5T_class_t label_class = labels.getDataType().getClass();
  KUAFU_CHECK(label_class == H5T_INTEGER, "HDF5 file ", path, ": dataset '", labels_name,
              "' must hold integer labels, found ", class_name(label_class), " values");
  const std::vector<hsize_t> label_dims = dims_of(labels);
  KUAFU_CHECK(label_dims.size() == 1, "HDF5 file ", path, ": dataset '", labels_name,
              "' must have rank 1 [N], found rank ", label_dims.size());
  KUAFU_CHECK(label_dims[0] == dims[0], "HDF5 file ", path, ": dataset '", labels_name, "' has ", label_dims[0],
              " labels but '", images_name, "' has ", dims[0], " images");

  ImageArray array;
  size_t count = 1;
  for (hsize_t d : dims) {
    array.shape.push_back(static_cast<int64_t>(d));
    count *= static_cast<size_t>(d);
  }
  array.pixels.resize(count);
  array.labels.resize(static_cast<size_t>(dims[0]));
  // HDF5 converts any integer label width or sign to int64 while reading.
  if (count > 0) images.read(array.pixels.data(), H5::PredType::NATIVE_UINT8);
  if (!array.labels.empty()) labels.read(array.labels.data(), H5::PredType::NATIVE_INT64);
  if (has_dataset(file, captions_name)) array.captions = read_strings(file, path, captions_name, dims[0]);
  return array;
}

}  // namespace

ImageArray read_hdf5_images(const std::string& path, const std::string& images, const std::string& labels,
                            const std::string& captions) {
  H5::Exception::dontPrint();  // errors reach the user once, as kuafu::Error
  KUAFU_CHECK(std::filesystem::is_regular_file(path), "HDF5 file ", path, " does not exist or is not a file");
  try {
    KUAFU_CHECK(H5::H5File::isHdf5(path), "file ", path, " is not an HDF5 file");
    const H5::H5File file(path, H5F_ACC_RDONLY);
    return read(file, path, images, labels, captions);
  } catch (const H5::Exception& e) {
    fail(detail::concat("HDF5 file ", path, ": ", e.getFuncName(), ": ", e.getDetailMsg()));
  }
}

}  // namespace kuafu::io
