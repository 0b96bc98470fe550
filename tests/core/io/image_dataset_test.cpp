// Image sets as tensors (io::open_image_dataset): a folder of two images, one with a caption file and
// one without; HDF5 arrays with and without a caption dataset; IDX files, which have no captions.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#ifdef KUAFU_WITH_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#endif

#include "core/io/image_dataset.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

using kuafu::testing::Contains;
using kuafu::testing::expected_error;
using Captions = std::vector<std::optional<std::string>>;

std::vector<int64_t> ints(const torch::Tensor& labels) {
  return {labels.data_ptr<int64_t>(), labels.data_ptr<int64_t>() + labels.numel()};
}

class ImageDatasetTest : public kuafu::testing::TempDirTest {
 protected:
  ImageDatasetTest() : TempDirTest("image_dataset_") {}

  // Gray 4 x 4 output, no normalisation beyond /255.
  static ImageSetSpec spec(const std::string& format, const std::string& location) {
    ImageSetSpec s;
    s.format = format;
    s.path = location;
    s.transform.size = 4;
    s.transform.channels = 1;
    s.transform.mean = {0};
    s.transform.std = {1};
    s.threads = 1;
    return s;
  }
};

#ifdef KUAFU_WITH_IMAGE_CODECS
TEST_F(ImageDatasetTest, FolderImagesCarryTheirCaptionFileWhenTheyHaveOne) {
  fs::create_directories(path("set/cat"));
  ASSERT_TRUE(cv::imwrite(path("set/cat/a.png"), cv::Mat(6, 6, CV_8UC3, cv::Scalar::all(51))));
  ASSERT_TRUE(cv::imwrite(path("set/cat/b.png"), cv::Mat(6, 6, CV_8UC3, cv::Scalar::all(102))));
  std::ofstream(path("set/cat/a.txt")) << "  a grey square\n";

  auto set = open_image_dataset(spec("folder", path("set")));
  ASSERT_EQ(set->size(), 2);
  EXPECT_EQ(set->class_names(), (std::vector<std::string>{"cat"}));
  const ImageTensors batch = set->batch({1, 0}, /*train=*/false, 0);
  EXPECT_EQ(batch.pixels.sizes().vec(), (std::vector<int64_t>{2, 1, 4, 4}));
  EXPECT_FLOAT_EQ(batch.pixels[0].mean().item<float>(), 102 / 255.0f);
  EXPECT_EQ(ints(batch.labels), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(batch.captions, (Captions{std::nullopt, "a grey square"}));
}

// An unreadable image is left out of `batch` (kept names the positions decoded), and
// batch_replacing_unreadable puts the next readable image of the set in its row, so a batch keeps its
// size (kuafu-sd once drew noise for the missing row and stopped on mismatched sizes).
TEST_F(ImageDatasetTest, AnUnreadableImageIsSkippedOrReplacedByTheNextReadableOne) {
  fs::create_directories(path("set/cat"));
  ASSERT_TRUE(cv::imwrite(path("set/cat/a.png"), cv::Mat(6, 6, CV_8UC3, cv::Scalar::all(51))));
  std::ofstream(path("set/cat/b.png"), std::ios::binary) << "not a png at all";
  ASSERT_TRUE(cv::imwrite(path("set/cat/c.png"), cv::Mat(6, 6, CV_8UC3, cv::Scalar::all(153))));
  std::ofstream(path("set/cat/c.txt")) << "c";
  std::ofstream(path("set/cat/d.png"), std::ios::binary);  // empty
  ImageSetSpec s = spec("folder", path("set"));
  s.max_corrupt_images = 2;
  auto set = open_image_dataset(s);
  ASSERT_EQ(set->size(), 4);

  const ImageTensors skipped = set->batch({1, 0}, /*train=*/false, 0);
  EXPECT_EQ(skipped.pixels.size(0), 1);
  EXPECT_EQ(skipped.kept, (std::vector<size_t>{1}));

  const ImageTensors full = batch_replacing_unreadable(*set, {0, 1, 0}, /*train=*/false, 0);
  EXPECT_EQ(full.pixels.sizes().vec(), (std::vector<int64_t>{3, 1, 4, 4}));
  EXPECT_EQ(full.kept, (std::vector<size_t>{0, 1, 2}));
  EXPECT_FLOAT_EQ(full.pixels[0].mean().item<float>(), 51 / 255.0f);
  EXPECT_FLOAT_EQ(full.pixels[1].mean().item<float>(), 153 / 255.0f) << "b.png's row holds c.png";
  EXPECT_EQ(full.captions, (Captions{std::nullopt, "c", std::nullopt}));
  // The last image unreadable: the next readable one wraps round to the first.
  const ImageTensors wrapped = batch_replacing_unreadable(*set, {3}, /*train=*/false, 0);
  EXPECT_FLOAT_EQ(wrapped.pixels[0].mean().item<float>(), 51 / 255.0f);
}

// A caption that is not UTF-8 is named when the set opens (the tokenizer once stopped training on it
// mid-run without naming the file).
TEST_F(ImageDatasetTest, ACaptionThatIsNotUtf8IsNamedWhenTheSetOpens) {
  fs::create_directories(path("set/cat"));
  ASSERT_TRUE(cv::imwrite(path("set/cat/a.png"), cv::Mat(6, 6, CV_8UC3, cv::Scalar::all(51))));
  std::ofstream(path("set/cat/a.txt"), std::ios::binary) << "caf\xE9 au lait";  // Latin-1
  EXPECT_TRUE(Contains(expected_error([&] { open_image_dataset(spec("folder", path("set"))); }),
                       path("set/cat/a.txt") + " is not UTF-8 text"));
}
#endif

void write_hdf5(const std::string& path, int n, bool captions) {
  H5::H5File file(path, H5F_ACC_TRUNC);
  const hsize_t image_dims[] = {static_cast<hsize_t>(n), 5, 5}, count[] = {static_cast<hsize_t>(n)};
  std::vector<uint8_t> pixels(static_cast<size_t>(n) * 25);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i / 25 * 10);
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = i % 3;
  file.createDataSet("images", H5::PredType::NATIVE_UINT8, H5::DataSpace(3, image_dims))
      .write(pixels.data(), H5::PredType::NATIVE_UINT8);
  file.createDataSet("labels", H5::PredType::NATIVE_INT64, H5::DataSpace(1, count))
      .write(labels.data(), H5::PredType::NATIVE_INT64);
  if (captions) {  // variable-length strings, as h5py writes Python strings
    const H5::StrType type(H5::PredType::C_S1, H5T_VARIABLE);
    std::vector<std::string> texts;
    for (int i = 0; i < n; ++i) texts.push_back("image " + std::to_string(i) + " ");
    std::vector<const char*> raw;
    for (const auto& text : texts) raw.push_back(text.c_str());
    file.createDataSet("captions", type, H5::DataSpace(1, count)).write(raw.data(), type);
    // Fixed-length, NUL-padded: one caption short of the images.
    const hsize_t short_count[] = {static_cast<hsize_t>(n - 1)};
    const H5::StrType fixed(H5::PredType::C_S1, 8);
    std::vector<char> bytes(static_cast<size_t>(n - 1) * 8, '\0');
    for (int i = 0; i + 1 < n; ++i) bytes[static_cast<size_t>(i) * 8] = static_cast<char>('a' + i);
    file.createDataSet("short_captions", fixed, H5::DataSpace(1, short_count)).write(bytes.data(), fixed);
  }
}

TEST_F(ImageDatasetTest, Hdf5CaptionsComeFromACaptionsDatasetWhenTheFileHasOne) {
  write_hdf5(path("captioned.h5"), 4, /*captions=*/true);
  write_hdf5(path("plain.h5"), 4, /*captions=*/false);
  auto captioned = open_image_dataset(spec("hdf5", path("captioned.h5")));
  EXPECT_EQ(captioned->stored_channels(), 1);
  EXPECT_EQ(captioned->class_names(), (std::vector<std::string>{"0", "1", "2"}));  // the largest label + 1
  const ImageTensors batch = captioned->batch({3, 1}, /*train=*/true, 7);
  EXPECT_EQ(ints(batch.labels), (std::vector<int64_t>{0, 1}));
  EXPECT_FLOAT_EQ(batch.pixels[0].mean().item<float>(), 30 / 255.0f);
  EXPECT_EQ(batch.captions, (Captions{"image 3", "image 1"}));
  EXPECT_EQ(open_image_dataset(spec("hdf5", path("plain.h5")))->batch({0}, false, 0).captions, (Captions{std::nullopt}));

  ImageSetSpec short_captions = spec("hdf5", path("captioned.h5"));
  short_captions.hdf5_captions = "short_captions";
  EXPECT_TRUE(Contains(expected_error([&] { open_image_dataset(short_captions); }),
                       "dataset 'short_captions' has 3 captions but the file has 4 images"));
  ImageSetSpec two_classes = spec("hdf5", path("plain.h5"));
  two_classes.num_classes = 2;
  EXPECT_TRUE(Contains(expected_error([&] { open_image_dataset(two_classes); }),
                       "plain.h5: label 2 of image 2 is outside [0, 2)"));
}

TEST_F(ImageDatasetTest, IdxImagesHaveNoCaptions) {
  auto write_gz = [](const std::string& file, std::vector<uint8_t> bytes) {
    gzFile out = gzopen(file.c_str(), "wb");
    ASSERT_NE(out, nullptr);
    ASSERT_EQ(gzwrite(out, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
    ASSERT_EQ(gzclose(out), Z_OK);
  };
  std::vector<uint8_t> images = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 2};
  images.insert(images.end(), {255, 255, 255, 255, 0, 0, 0, 0});
  write_gz(path("set-images-idx3-ubyte.gz"), images);
  write_gz(path("set-labels-idx1-ubyte.gz"), {0, 0, 8, 1, 0, 0, 0, 2, 1, 0});
  ImageSetSpec idx = spec("idx", path("set"));
  idx.num_classes = 10;
  auto set = open_image_dataset(idx);
  EXPECT_EQ(set->class_names().size(), 10u);
  const ImageTensors batch = set->batch({0, 1}, /*train=*/false, 0);
  EXPECT_EQ(ints(batch.labels), (std::vector<int64_t>{1, 0}));
  EXPECT_FLOAT_EQ(batch.pixels[0].mean().item<float>(), 1.0f);
  EXPECT_EQ(batch.captions, (Captions{std::nullopt, std::nullopt}));
  EXPECT_TRUE(Contains(expected_error([&] { open_image_dataset(spec("idx", path("absent"))); }),
                       "absent-images-idx3-ubyte.gz does not exist"));
}

}  // namespace
}  // namespace kuafu::io
