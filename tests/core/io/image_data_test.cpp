// Image data pipeline without LibTorch: IDX files (raw, gzipped, damaged, Fashion-MNIST), image folder
// scans, the train/eval transforms, the threaded folder loader with corrupt images, and HDF5 images.
#include <H5Cpp.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "core/io/hdf5_images.h"
#include "core/io/idx_file.h"
#include "core/io/image_augment.h"
#include "core/io/image_folder.h"
#include "core/io/image_loader.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

using kuafu::testing::Contains;
using kuafu::testing::expected_error;
using Bytes = std::vector<uint8_t>;

// Each test gets its own temporary folder, removed afterwards.
class ImageDataTest : public kuafu::testing::TempDirTest {
 protected:
  ImageDataTest() : TempDirTest("image_data_") {}
};

void write_raw(const std::string& path, const Bytes& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

// IDX header for unsigned bytes with the given dimensions, then `data`.
Bytes idx_bytes(const std::vector<uint32_t>& dims, const Bytes& data, uint8_t type = 0x08) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// ---------------------------------------------------------------------------------------------- IDX

TEST_F(ImageDataTest, IdxRawFileParsesShapeAndData) {
  Bytes data(24);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 11);
  write_raw(path("a.idx"), idx_bytes({2, 3, 4}, data));
  const IdxArray array = read_idx(path("a.idx"));
  EXPECT_EQ(array.shape, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(array.data, data);
}

TEST_F(ImageDataTest, IdxGzippedFileParsesShapeAndData) {
  write_gz(path("labels.gz"), idx_bytes({5}, {9, 0, 3, 255, 1}));
  const IdxArray array = read_idx(path("labels.gz"));
  EXPECT_EQ(array.shape, (std::vector<int64_t>{5}));
  EXPECT_EQ(array.data, (Bytes{9, 0, 3, 255, 1}));
}

TEST_F(ImageDataTest, IdxFormatErrorsNameOffsetExpectedAndFound) {
  write_raw(path("magic.idx"), {1, 2, 8, 1, 0, 0, 0, 1, 7});
  const std::string magic = expected_error([&] { read_idx(path("magic.idx")); });
  EXPECT_TRUE(Contains(magic, path("magic.idx")));
  EXPECT_TRUE(Contains(magic, "bad magic at byte offset 0: expected 0x00 0x00, found 0x01 0x02"));

  write_raw(path("float.idx"), idx_bytes({1}, {0, 0, 0, 0}, 0x0D));
  EXPECT_TRUE(Contains(expected_error([&] { read_idx(path("float.idx")); }),
                       "unsupported data type at byte offset 2: expected 0x08 (unsigned byte), found 0x0d (float)"));

  // 10 bytes promised after an 8-byte header, 7 present.
  write_gz(path("short.gz"), idx_bytes({10}, Bytes(7, 1)));
  const std::string truncated = expected_error([&] { read_idx(path("short.gz")); });
  EXPECT_TRUE(Contains(truncated, path("short.gz")));
  EXPECT_TRUE(Contains(truncated, "truncated data at uncompressed byte offset 15: expected 10 data bytes"));
  EXPECT_TRUE(Contains(truncated, "found 7"));

  write_raw(path("long.idx"), idx_bytes({3}, Bytes(5, 1)));
  EXPECT_TRUE(Contains(expected_error([&] { read_idx(path("long.idx")); }),
                       "trailing data at byte offset 11: expected end of file, found 2 more bytes"));

  write_raw(path("header.idx"), {0, 0, 8, 2, 0, 0});
  EXPECT_TRUE(Contains(expected_error([&] { read_idx(path("header.idx")); }), "truncated header at byte offset 6"));

  EXPECT_TRUE(Contains(expected_error([&] { read_idx(path("absent.gz")); }), "does not exist"));
}

TEST_F(ImageDataTest, IdxHeaderClaimingMoreThanTheFileHoldsFailsWithoutAllocatingIt) {
  // A 33-byte file claiming 16 GiB allocated and zeroed 16 GiB before failing; a claim of 2^40 bytes
  // threw a bare std::bad_alloc.
  const Bytes claim_16g = idx_bytes({4, 65536, 65536}, Bytes(17, 1));
  ASSERT_EQ(claim_16g.size(), 33u);
  write_raw(path("claim.idx"), claim_16g);
  write_gz(path("claim.gz"), claim_16g);
  const Bytes claim_2_40 = idx_bytes({1024, 1024, 1024, 1024}, Bytes(17, 1));
  write_raw(path("huge.idx"), claim_2_40);
  write_gz(path("huge.gz"), claim_2_40);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"claim.idx", "truncated data at byte offset 33: expected 17179869184 data bytes (shape 4 x 65536 x 65536) "
                    "after the 16-byte header, found 17"},
      {"claim.gz", "truncated data at uncompressed byte offset 33: expected 17179869184 data bytes (shape 4 x "
                   "65536 x 65536) after the 16-byte header, found 17"},
      {"huge.idx", "expected 1099511627776 data bytes (shape 1024 x 1024 x 1024 x 1024) after the 20-byte header, "
                   "found 17"},
      {"huge.gz", "expected 1099511627776 data bytes (shape 1024 x 1024 x 1024 x 1024) after the 20-byte header, "
                  "found 17"}};
  for (const auto& [name, expected] : cases) {
    const auto start = std::chrono::steady_clock::now();
    const std::string message = expected_error([&] { read_idx(path(name)); });
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 2.0) << name;
    EXPECT_TRUE(Contains(message, "IDX file " + path(name) + ": "));
    EXPECT_TRUE(Contains(message, expected));
  }
}

TEST_F(ImageDataTest, IdxGzippedDataLargerThanTheFirstReadParses) {
  // Gzipped data arrives in growing pieces; several of them must add up to the array.
  Bytes data(3 * 1024 * 1024 + 5);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + i / 4096);
  write_gz(path("big.gz"), idx_bytes({3, 1024 * 1024 + 1, 1}, Bytes(data.begin(), data.end() - 2)));
  const IdxArray array = read_idx(path("big.gz"));
  EXPECT_EQ(array.shape, (std::vector<int64_t>{3, 1024 * 1024 + 1, 1}));
  EXPECT_TRUE(array.data == Bytes(data.begin(), data.end() - 2));
  write_gz(path("short_big.gz"), idx_bytes({3, 1024 * 1024 + 2, 1}, data));
  EXPECT_TRUE(Contains(expected_error([&] { read_idx(path("short_big.gz")); }),
                       "expected 3145734 data bytes (shape 3 x 1048578 x 1) after the 16-byte header, found 3145733"));
}

TEST_F(ImageDataTest, IdxFashionMnistHasTheKnownShapesAndBalancedClasses) {
  const std::string base = "/usr/share/datasets/fashion-mnist/";
  ASSERT_TRUE(fs::exists(base + "t10k-labels-idx1-ubyte.gz"))
      << "Fashion-MNIST is missing from " << base << ": scripts/setup installs it (Debian package dataset-fashion-mnist)";
  const std::vector<std::pair<std::string, int64_t>> splits = {{"train", 60000}, {"t10k", 10000}};
  for (const auto& [split, n] : splits) {
    const IdxArray images = read_idx(base + split + "-images-idx3-ubyte.gz");
    const IdxArray labels = read_idx(base + split + "-labels-idx1-ubyte.gz");
    EXPECT_EQ(images.shape, (std::vector<int64_t>{n, 28, 28}));
    EXPECT_EQ(images.data.size(), static_cast<size_t>(n * 28 * 28));
    EXPECT_EQ(*std::max_element(images.data.begin(), images.data.end()), 255);
    ASSERT_EQ(labels.shape, (std::vector<int64_t>{n}));
    std::vector<int64_t> per_class(10, 0);
    for (uint8_t label : labels.data) {
      ASSERT_LT(label, 10);
      ++per_class[label];
    }
    EXPECT_EQ(per_class, std::vector<int64_t>(10, n / 10)) << split;
  }
}

// --------------------------------------------------------------------------------------- folders

cv::Mat solid_image(int rows, int cols, uint8_t value) { return cv::Mat(rows, cols, CV_8UC3, cv::Scalar::all(value)); }

void write_image(const std::string& path, const cv::Mat& image) {
  fs::create_directories(fs::path(path).parent_path());
  ASSERT_TRUE(cv::imwrite(path, image)) << path;
}

TEST_F(ImageDataTest, FolderScanSortsClassesAndItems) {
  write_image(path("train/dog/d.png"), solid_image(6, 8, 10));
  write_image(path("train/dog/c.jpeg"), solid_image(6, 8, 20));
  write_image(path("train/cat/a.png"), solid_image(6, 8, 30));
  write_image(path("train/cat/B.JPG"), solid_image(6, 8, 40));
  write_raw(path("train/cat/notes.txt"), {1, 2, 3});
  write_image(path("train/.cache/x.png"), solid_image(6, 8, 50));

  const ImageFolderIndex index = scan_image_folder(path("train"));
  EXPECT_EQ(index.classes, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(index.items.size(), 4u);
  const std::vector<std::string> paths = {path("train/cat/B.JPG"), path("train/cat/a.png"), path("train/dog/c.jpeg"),
                                          path("train/dog/d.png")};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(index.items[i].path, paths[i]);
    EXPECT_EQ(index.items[i].label, i < 2 ? 0 : 1);
  }

  // A validation folder holding only "dog" still labels it 1, as in training.
  write_image(path("val/dog/v.png"), solid_image(6, 8, 60));
  const ImageFolderIndex val = scan_image_folder(path("val"), index.classes);
  EXPECT_EQ(val.classes, index.classes);
  ASSERT_EQ(val.items.size(), 1u);
  EXPECT_EQ(val.items[0].label, 1);

  write_image(path("val/bird/b.png"), solid_image(6, 8, 70));
  EXPECT_TRUE(Contains(expected_error([&] { scan_image_folder(path("val"), index.classes); }), "'bird'"));
}

TEST_F(ImageDataTest, FolderScanErrors) {
  EXPECT_TRUE(Contains(expected_error([&] { scan_image_folder(path("absent")); }), "does not exist"));
  fs::create_directories(path("flat"));
  write_image(path("flat/a.png"), solid_image(4, 4, 1));
  EXPECT_TRUE(Contains(expected_error([&] { scan_image_folder(path("flat")); }), "has no class sub-folders"));
  fs::create_directories(path("empty/cat"));
  EXPECT_TRUE(Contains(expected_error([&] { scan_image_folder(path("empty")); }), "has no .jpg/.jpeg/.png images"));
  write_image(path("empty/dog/a.png"), solid_image(4, 4, 1));
  EXPECT_TRUE(Contains(expected_error([&] { scan_image_folder(path("empty")); }), "class folder 'cat' has no"));
}

// ------------------------------------------------------------------------------------ transforms

// Random BGR content, the same every run.
cv::Mat noise_image(int rows, int cols) {
  cv::Mat image(rows, cols, CV_8UC3);
  cv::RNG rng(1234);
  rng.fill(image, cv::RNG::UNIFORM, 0, 256);
  return image;
}

std::vector<float> train_output(const cv::Mat& image, const ImageTransform& t, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(t.channels) * t.size * t.size);
  std::mt19937_64 rng(seed);
  train_transform(image, t, rng, out.data());
  return out;
}

TEST_F(ImageDataTest, TrainTransformIsNormalisedAndSeeded) {
  ImageTransform t;
  t.size = 16;
  const cv::Mat image = noise_image(40, 50);
  const std::vector<float> out = train_output(image, t, 7);
  ASSERT_EQ(out.size(), 3u * 16 * 16);
  for (int c = 0; c < 3; ++c) {
    const float lo = (0.0f - t.mean[c]) / t.std[c], hi = (1.0f - t.mean[c]) / t.std[c];
    for (int i = 0; i < 256; ++i) {
      ASSERT_GE(out[c * 256 + i], lo);
      ASSERT_LE(out[c * 256 + i], hi);
    }
  }
  EXPECT_EQ(train_output(image, t, 7), out);
  EXPECT_NE(train_output(image, t, 8), out);
}

// With the crop forced to the whole image, the output is a plain resize, mirrored or not.
TEST_F(ImageDataTest, TrainTransformFullCropIsResizeAndFlipMirrors) {
  ImageTransform t;
  t.size = 8;
  t.scale_min = t.scale_max = 1.0;
  t.ratio_min = t.ratio_max = 2.0;  // the image's own width / height
  t.mean = {0, 0, 0};
  t.std = {1, 1, 1};
  const cv::Mat image = noise_image(16, 32);
  cv::Mat rgb, resized, mirrored;
  cv::cvtColor(image, rgb, cv::COLOR_BGR2RGB);
  cv::resize(rgb, resized, cv::Size(8, 8), 0, 0, cv::INTER_LINEAR);
  cv::flip(resized, mirrored, 1);
  auto chw = [](const cv::Mat& m) {
    std::vector<float> out(3 * 64);
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < 8; ++y)
        for (int x = 0; x < 8; ++x) out[c * 64 + y * 8 + x] = m.at<cv::Vec3b>(y, x)[c] / 255.0f;
    return out;
  };
  t.flip = false;
  EXPECT_EQ(train_output(image, t, 1), chw(resized));
  t.flip = true;
  int plain = 0, flipped = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> out = train_output(image, t, seed);
    plain += out == chw(resized);
    flipped += out == chw(mirrored);
  }
  EXPECT_EQ(plain + flipped, 20);
  EXPECT_GT(plain, 0);
  EXPECT_GT(flipped, 0);
}

TEST_F(ImageDataTest, EvalTransformTakesTheCentreColumnsInRgbOrder) {
  ImageTransform t;
  t.size = 4;
  t.resize_ratio = 1.0;  // shorter side resized to 4
  t.mean = {0, 0, 0};
  t.std = {1, 1, 1};
  // 8 x 24, value 10 * column in blue only: halving averages columns 2x, 2x+1 into 20x + 5, and the
  // centre 4 of the 12 resized columns are 4..7.
  cv::Mat image(8, 24, CV_8UC3, cv::Scalar::all(0));
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 24; ++x) image.at<cv::Vec3b>(y, x)[0] = static_cast<uint8_t>(10 * x);
  std::vector<float> out(3 * 16);
  eval_transform(image, t, out.data());
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) {
      EXPECT_EQ(out[0 * 16 + y * 4 + x], 0.0f);  // red
      EXPECT_EQ(out[1 * 16 + y * 4 + x], 0.0f);  // green
      EXPECT_FLOAT_EQ(out[2 * 16 + y * 4 + x], (20 * (x + 4) + 5) / 255.0f) << "row " << y << " col " << x;
    }
  }
  // A tall image is cropped in rows the same way: 24 x 8 with value 10 * row.
  cv::Mat tall(24, 8, CV_8UC3);
  for (int y = 0; y < 24; ++y) tall.row(y).setTo(cv::Scalar::all(10 * y));
  eval_transform(tall, t, out.data());
  for (int y = 0; y < 4; ++y) EXPECT_FLOAT_EQ(out[y * 4 + 1], (20 * (y + 4) + 5) / 255.0f);
}

// diffusers' preparation of `size` px without flips, the output the pixels / 255 (mean 0, std 1).
ImageTransform unflipped_square_crop(int size) {
  ImageTransform t;
  t.size = size;
  t.mean = {0, 0, 0};
  t.std = {1, 1, 1};
  t.flip = false;
  t.square_crop = true;
  return t;
}

// diffusers' preparation (ImageTransform::square_crop): the shorter side resized to `size`, the longer keeping the
// aspect ratio, and the square cut at the centre, rounded as torchvision's CenterCrop (halves to even), or in training
// with random_square_crop anywhere; the placement says where it cut.
TEST_F(ImageDataTest, SquareCropResizesTheShorterSideAndSaysWhereItCut) {
  ImageTransform t = unflipped_square_crop(5);
  // 10 x 32, value 8 * column in blue: halved to 5 x 16 (columns 16x + 4), whose centre 5 start at round(5.5) = 6.
  cv::Mat image(10, 32, CV_8UC3, cv::Scalar::all(0));
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 32; ++x) image.at<cv::Vec3b>(y, x)[0] = static_cast<uint8_t>(8 * x);
  std::vector<float> out(3 * 25);
  const auto expect_columns_from = [&](int64_t left) {
    for (int x = 0; x < 5; ++x) EXPECT_FLOAT_EQ(out[2 * 25 + 4 * 5 + x], (16 * (x + left) + 4) / 255.0f) << "column " << x;
  };
  const ImagePlacement centre = eval_transform(image, t, out.data());
  EXPECT_EQ(centre, (ImagePlacement{10, 32, 0, 6}));
  expect_columns_from(6);
  std::mt19937_64 rng(1);
  EXPECT_EQ(train_transform(image, t, rng, out.data()), centre) << "training cuts the centre too unless random_square_crop";
  t.random_square_crop = true;
  std::set<int64_t> lefts;
  for (uint64_t seed = 0; seed < 30; ++seed) {
    std::mt19937_64 seeded(seed);
    const ImagePlacement cut = train_transform(image, t, seeded, out.data());
    EXPECT_EQ(cut.original_height, 10);
    EXPECT_EQ(cut.original_width, 32);
    EXPECT_EQ(cut.top, 0);
    ASSERT_GE(cut.left, 0);
    ASSERT_LE(cut.left, 11);
    expect_columns_from(cut.left);
    lefts.insert(cut.left);
  }
  EXPECT_GT(lefts.size(), 5u);
  // A tall image is cut in rows: 32 x 10 with value 8 * row.
  t.random_square_crop = false;
  cv::Mat tall(32, 10, CV_8UC3);
  for (int y = 0; y < 32; ++y) tall.row(y).setTo(cv::Scalar::all(8 * y));
  EXPECT_EQ(eval_transform(tall, t, out.data()), (ImagePlacement{32, 10, 6, 0}));
  for (int y = 0; y < 5; ++y) EXPECT_FLOAT_EQ(out[y * 5 + 1], (16 * (y + 6) + 4) / 255.0f);
  t.square_crop = false;
  t.random_square_crop = true;
  EXPECT_TRUE(Contains(expected_error([&] { eval_transform(tall, t, out.data()); }), "random_square_crop needs square_crop"));
}

TEST_F(ImageDataTest, GrayTransformWritesOneChannel) {
  ImageTransform t;
  t.size = 8;
  t.channels = 1;
  t.mean = {0.5f};
  t.std = {0.5f};
  const cv::Mat gray(20, 30, CV_8UC1, cv::Scalar(255));
  const std::vector<float> out = train_output(gray, t, 3);
  ASSERT_EQ(out.size(), 64u);
  for (float v : out) EXPECT_EQ(v, 1.0f);
  // A colour image is converted to gray.
  std::vector<float> eval(64);
  eval_transform(solid_image(20, 30, 0), t, eval.data());
  for (float v : eval) EXPECT_EQ(v, -1.0f);

  t.mean = {0.5f, 0.5f, 0.5f};
  EXPECT_TRUE(Contains(expected_error([&] { eval_transform(gray, t, eval.data()); }), "mean and std need 1 values"));
}

// ---------------------------------------------------------------------------------- aspect buckets

// kohya's default list for 512 px (steps of 64, sides 256 to 1024), worked by hand: for each width w, the tallest
// height of the step with w × h <= 512² and within the sides, and the same on its side; tallest first.
TEST_F(ImageDataTest, AspectBucketsAreKohyasListForTheResolution) {
  const std::vector<ImageSize> expected = {{1024, 256}, {960, 256}, {896, 256}, {832, 256}, {768, 320}, {704, 320},
                                           {640, 384},  {576, 448}, {512, 512}, {448, 576}, {384, 640}, {320, 704},
                                           {320, 768},  {256, 832}, {256, 896}, {256, 960}, {256, 1024}};
  const std::vector<ImageSize> buckets = aspect_buckets({512, 64, 256, 1024});
  EXPECT_EQ(buckets, expected);
  for (const ImageSize& b : buckets) EXPECT_LE(b.height * b.width, 512 * 512);
  // Nearest by log ratio: 1000 x 1500 (0.667) is 384 x 640's (0.6) before 448 x 576's (0.778); 2:1 is 704 x 320's
  // (2.2) before 640 x 384's (1.67); a square is the square; a panorama the widest.
  EXPECT_EQ(buckets[nearest_bucket(buckets, {1500, 1000})], (ImageSize{640, 384}));
  EXPECT_EQ(buckets[nearest_bucket(buckets, {500, 1000})], (ImageSize{320, 704}));
  EXPECT_EQ(buckets[nearest_bucket(buckets, {77, 77})], (ImageSize{512, 512}));
  EXPECT_EQ(buckets[nearest_bucket(buckets, {100, 2000})], (ImageSize{256, 1024}));
  EXPECT_TRUE(Contains(expected_error([] { aspect_buckets({512, 64, 200, 1024}); }), "buckets.min_side (200)"));
  EXPECT_TRUE(Contains(expected_error([] { aspect_buckets({512, 64, 576, 1024}); }), "<= the resolution (512)"));
  EXPECT_TRUE(Contains(expected_error([] { nearest_bucket({{8, 8}}, {0, 5}); }), "no aspect ratio"));
}

// At 16 px in steps of 4 (sides 8 to 32) the buckets are 32x8 ... 8x32 (height x width). A 10 x 30 image has
// 8 x 24's ratio: resized whole, nothing cut. A 10 x 20 image is 12 x 20's: resized to cover it (12 x 24), the
// centre 20 columns cut from column round(4 / 2) = 2.
TEST_F(ImageDataTest, BucketedTransformResizesToTheNearestBucketAndCutsNothingWhenItFits) {
  ImageTransform t = unflipped_square_crop(16);
  t.buckets = aspect_buckets({16, 4, 8, 32});
  EXPECT_EQ(t.buckets, (std::vector<ImageSize>{{32, 8}, {28, 8}, {24, 8}, {20, 12}, {16, 16}, {12, 20}, {8, 24}, {8, 28}, {8, 32}}));
  const cv::Mat fits = noise_image(10, 30);
  ASSERT_EQ(output_size(t, {10, 30}), (ImageSize{8, 24}));
  std::vector<float> out(3 * 8 * 24);
  std::mt19937_64 rng(3);
  t.random_square_crop = true;  // nothing to move: the cut is the whole
  EXPECT_EQ(train_transform(fits, t, rng, out.data()), (ImagePlacement{10, 30, 0, 0}));
  cv::Mat whole;
  cv::resize(fits, whole, cv::Size(24, 8), 0, 0, cv::INTER_LINEAR);
  for (int y = 0; y < 8; ++y) {
    for (int x = 0; x < 24; ++x) {
      // Channel 0 of the output is red, OpenCV's channel 2.
      ASSERT_FLOAT_EQ(out[static_cast<size_t>(y * 24 + x)], whole.at<cv::Vec3b>(y, x)[2] / 255.0f) << y << ", " << x;
    }
  }
  t.random_square_crop = false;
  cv::Mat wide(10, 20, CV_8UC3, cv::Scalar::all(0));
  for (int x = 0; x < 20; ++x) wide.col(x).setTo(cv::Scalar::all(10 * x));
  ASSERT_EQ(output_size(t, {10, 20}), (ImageSize{12, 20}));
  out.assign(3 * 12 * 20, 0.0f);
  EXPECT_EQ(eval_transform(wide, t, out.data()), (ImagePlacement{10, 20, 0, 2}));
  cv::Mat covered;
  cv::resize(wide, covered, cv::Size(24, 12), 0, 0, cv::INTER_LINEAR);
  for (int x = 0; x < 20; ++x) EXPECT_FLOAT_EQ(out[static_cast<size_t>(5 * 20 + x)], covered.at<cv::Vec3b>(5, x + 2)[0] / 255.0f) << x;
  t.square_crop = false;
  EXPECT_TRUE(Contains(expected_error([&] { eval_transform(wide, t, out.data()); }), "buckets need square_crop"));
}

// ------------------------------------------------------------------------------------------ loader

TEST_F(ImageDataTest, LoaderSkipsCorruptImagesThenFailsPastTheLimit) {
  write_image(path("data/cat/a.png"), solid_image(20, 24, 100));
  write_image(path("data/cat/b.jpg"), solid_image(30, 20, 150));
  write_raw(path("data/cat/bad.jpg"), Bytes(300, 0x5a));
  write_image(path("data/dog/c.png"), solid_image(24, 24, 200));
  write_raw(path("data/dog/worse.png"), {0x89, 'P', 'N', 'G', 1, 2, 3});
  const ImageFolderIndex index = scan_image_folder(path("data"));
  ASSERT_EQ(index.items.size(), 5u);  // cat: a.png b.jpg bad.jpg; dog: c.png worse.png
  ImageTransform t;
  t.size = 8;
  ImageFolderLoader loader(index, t, /*threads=*/2, /*max_corrupt=*/1);

  const ImageBatch batch = loader.load({0, 1, 2, 3}, /*train=*/false, 0);
  EXPECT_EQ(batch.labels, (std::vector<int64_t>{0, 0, 1}));
  EXPECT_EQ(batch.pixels.size(), 3u * 3 * 8 * 8);
  EXPECT_EQ(batch.skipped, (std::vector<std::string>{path("data/cat/bad.jpg")}));
  EXPECT_EQ(loader.corrupt_count(), 1);
  // Slot 2 is c.png (value 200 everywhere), moved up past the skipped image.
  EXPECT_FLOAT_EQ(batch.pixels[2 * 192], (200 / 255.0f - t.mean[0]) / t.std[0]);

  // The same bad image again is skipped but not counted twice.
  EXPECT_EQ(loader.load({2}, true, 1).skipped.size(), 1u);
  EXPECT_EQ(loader.corrupt_count(), 1);

  const std::string error = expected_error([&] { loader.load({3, 4}, true, 2); });
  EXPECT_TRUE(Contains(error, "2 skipped"));
  EXPECT_TRUE(Contains(error, "limit of 1"));
  EXPECT_TRUE(Contains(error, "data.max_corrupt_images"));
}

TEST_F(ImageDataTest, LoaderAugmentationDoesNotDependOnThreadsOrOrder) {
  for (int i = 0; i < 6; ++i)
    write_image(path("data/c" + std::to_string(i % 2) + "/" + std::to_string(i) + ".png"), noise_image(20 + i, 30));
  const ImageFolderIndex index = scan_image_folder(path("data"));
  ImageTransform t;
  t.size = 8;
  const size_t plane = 3 * 8 * 8;
  const ImageBatch one = ImageFolderLoader(index, t, 1, 0).load({0, 1, 2, 3, 4, 5}, true, 42);
  const ImageBatch three = ImageFolderLoader(index, t, 3, 0).load({0, 1, 2, 3, 4, 5}, true, 42);
  EXPECT_EQ(one.pixels, three.pixels);
  EXPECT_EQ(one.labels, three.labels);
  const ImageBatch reversed = ImageFolderLoader(index, t, 3, 0).load({5, 4, 3, 2, 1, 0}, true, 42);
  for (size_t k = 0; k < 6; ++k) {
    EXPECT_TRUE(std::equal(reversed.pixels.begin() + k * plane, reversed.pixels.begin() + (k + 1) * plane,
                           one.pixels.begin() + (5 - k) * plane));
  }
  EXPECT_NE(ImageFolderLoader(index, t, 3, 0).load({0}, true, 43).pixels,
            std::vector<float>(one.pixels.begin(), one.pixels.begin() + plane));
  EXPECT_TRUE(Contains(expected_error([&] { ImageFolderLoader(index, t, 1, 0).load({6}, false, 0); }), "out of range"));
}

// A batch of one bucket loads at its size; images of two buckets in one batch are refused by name; the sizes
// of every image come from one decode of the folder, an unreadable one {0, 0} and counted.
TEST_F(ImageDataTest, LoaderWithBucketsLoadsABucketsImagesAndKnowsEverySize) {
  write_image(path("data/a/0.png"), noise_image(10, 30));
  write_image(path("data/a/1.png"), noise_image(20, 60));
  write_image(path("data/a/2.png"), noise_image(10, 20));
  write_raw(path("data/a/3.png"), Bytes(300, 0x5a));
  const ImageFolderIndex index = scan_image_folder(path("data"));
  ImageTransform t;
  t.size = 16;
  t.square_crop = true;
  t.buckets = aspect_buckets({16, 4, 8, 32});
  ImageFolderLoader loader(index, t, 2, 1);
  const ImageBatch batch = loader.load({0, 1}, true, 5);
  EXPECT_EQ(batch.height, 8);
  EXPECT_EQ(batch.width, 24);
  EXPECT_EQ(batch.pixels.size(), 2u * 3 * 8 * 24);
  EXPECT_EQ(batch.placements[1], (ImagePlacement{20, 60, 0, 0}));
  const std::string error = expected_error([&] { loader.load({0, 2}, false, 0); });
  EXPECT_TRUE(Contains(error, path("data/a/2.png") + " falls in the 20x12 aspect bucket"));
  EXPECT_TRUE(Contains(error, "share one"));
  EXPECT_EQ(loader.image_sizes(), (std::vector<ImageSize>{{10, 30}, {20, 60}, {10, 20}, {0, 0}}));
  EXPECT_EQ(loader.corrupt_count(), 1);
  EXPECT_EQ(loader.load({3, 2}, false, 0).skipped, (std::vector<std::string>{path("data/a/3.png")}));
  EXPECT_EQ(loader.corrupt_count(), 1) << "known from the sizes' decode, not counted again";
}

// -------------------------------------------------------------------------------------------- HDF5

template <typename T>
void write_dataset(H5::H5File& file, const std::string& name, const std::vector<hsize_t>& dims,
                   const H5::PredType& type, const std::vector<T>& values) {
  H5::DataSpace space(static_cast<int>(dims.size()), dims.data());
  file.createDataSet(name, type, space).write(values.data(), type);
}

TEST_F(ImageDataTest, Hdf5RoundTripAndErrors) {
  std::vector<uint8_t> pixels(2 * 3 * 4 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 5);
  {
    H5::H5File file(path("images.h5"), H5F_ACC_TRUNC);
    write_dataset(file, "images", {2, 3, 4, 3}, H5::PredType::NATIVE_UINT8, pixels);
    write_dataset(file, "labels", {2}, H5::PredType::NATIVE_INT32, std::vector<int32_t>{7, -1});
    write_dataset(file, "gray", {3, 2, 2}, H5::PredType::NATIVE_UINT8, std::vector<uint8_t>(12, 9));
    write_dataset(file, "float_labels", {2}, H5::PredType::NATIVE_FLOAT, std::vector<float>{0, 1});
    write_dataset(file, "flat", {4}, H5::PredType::NATIVE_UINT8, std::vector<uint8_t>(4, 0));
  }
  const ImageArray array = read_hdf5_images(path("images.h5"));
  EXPECT_EQ(array.shape, (std::vector<int64_t>{2, 3, 4, 3}));
  EXPECT_EQ(array.pixels, pixels);
  EXPECT_EQ(array.labels, (std::vector<int64_t>{7, -1}));

  const std::string h5 = path("images.h5");
  EXPECT_TRUE(Contains(expected_error([&] { read_hdf5_images(h5, "images", "targets"); }), "no dataset 'targets'"));
  EXPECT_TRUE(Contains(expected_error([&] { read_hdf5_images(h5, "images", "float_labels"); }), "integer labels"));
  EXPECT_TRUE(Contains(expected_error([&] { read_hdf5_images(h5, "flat"); }), "found rank 1"));
  EXPECT_TRUE(Contains(expected_error([&] { read_hdf5_images(h5, "gray"); }), "has 2 labels but 'gray' has 3"));
  EXPECT_TRUE(Contains(expected_error([&] { read_hdf5_images(path("absent.h5")); }), "does not exist"));
  write_raw(path("text.h5"), {'h', 'i'});
  EXPECT_TRUE(Contains(expected_error([&] { read_hdf5_images(path("text.h5")); }), "is not an HDF5 file"));
}

}  // namespace
}  // namespace kuafu::io
