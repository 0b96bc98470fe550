#include "core/io/hdf5_images.h"

#include <H5Cpp.h>

#include <filesystem>

#include "core/util/error.h"

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

H5::DataSet open_dataset(const H5::H5File& file, const std::string& path, const std::string& name) {
  bool exists = false;
  try {
    exists = file.nameExists(name);
  } catch (const H5::Exception&) {
    // A missing parent group in "group/name" throws instead of answering false.
  }
  KUAFU_CHECK(exists, "HDF5 file ", path, " has no dataset '", name, "'");
  try {
    return file.openDataSet(name);
  } catch (const H5::Exception& e) {
    fail(detail::concat("HDF5 file ", path, ": '", name, "' is not a readable dataset (", e.getDetailMsg(), ")"));
  }
}

ImageArray read(const H5::H5File& file, const std::string& path, const std::string& images_name,
                const std::string& labels_name) {
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
  return array;
}

}  // namespace

ImageArray read_hdf5_images(const std::string& path, const std::string& images, const std::string& labels) {
  H5::Exception::dontPrint();  // errors reach the user once, as kuafu::Error
  KUAFU_CHECK(std::filesystem::is_regular_file(path), "HDF5 file ", path, " does not exist or is not a file");
  try {
    KUAFU_CHECK(H5::H5File::isHdf5(path), "file ", path, " is not an HDF5 file");
    const H5::H5File file(path, H5F_ACC_RDONLY);
    return read(file, path, images, labels);
  } catch (const H5::Exception& e) {
    fail(detail::concat("HDF5 file ", path, ": ", e.getFuncName(), ": ", e.getDetailMsg()));
  }
}

}  // namespace kuafu::io
