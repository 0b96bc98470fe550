// .npz archives against NumPy itself: what np.savez and np.savez_compressed write reads as the arrays
// they hold (every dtype, C and Fortran order, 0-d and empty), and what Kuafu writes np.load reads back
// equal; bad archives are named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <torch/torch.h>

#include "core/io/npz.h"
#include "core/util/atomic_file.h"
#include "tests/support/python_reference.h"
#include "tests/support/test_util.h"

namespace kuafu::io {
namespace {
namespace fs = std::filesystem;

const std::string kQueryW =
    "alphafold/alphafold_iteration/evoformer/evoformer_iteration/msa_row_attention_with_pair_bias/attention//query_w";

class NpzTest : public testing::TempDirTest {
 protected:
  NpzTest() : TempDirTest("npz_") {}
};

TEST_F(NpzTest, ReadsWhatNumpyWritesAndNumpyReadsWhatItWrites) {
  const testing::PythonRun made = testing::run_python_reference("npz_reference.py", "write " + dir_.string());
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const NpzArrays stored = read_npz(path("stored.npz"));
  const NpzArrays deflated = read_npz(path("deflated.npz"));
  ASSERT_EQ(stored.size(), 12u);
  for (const auto& [name, array] : stored) EXPECT_TRUE(torch::equal(array, deflated.at(name))) << name;
  // Values worked out from the script's arrays.
  EXPECT_EQ(stored.at(kQueryW).sizes(), torch::IntArrayRef({2, 8, 4, 3}));
  EXPECT_EQ(stored.at(kQueryW).scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(stored.at("i32"), torch::arange(-6, 6, torch::kInt32).view({3, 4})));
  EXPECT_EQ(stored.at("i64")[0].item<int64_t>(), int64_t{1} << 40);
  EXPECT_EQ(stored.at("i16")[0][0].item<int16_t>(), -300);
  EXPECT_EQ(stored.at("u8")[1].item<uint8_t>(), 255);
  EXPECT_EQ(stored.at("bool").scalar_type(), torch::kBool);
  EXPECT_EQ(stored.at("scalar").dim(), 0);
  EXPECT_EQ(stored.at("scalar").item<float>(), 3.5f);
  EXPECT_EQ(stored.at("empty").sizes(), torch::IntArrayRef({0, 4}));
  EXPECT_EQ(stored.at("f16").scalar_type(), torch::kFloat16);
  EXPECT_EQ(stored.at("fortran").sizes(), torch::IntArrayRef({3, 4, 2}));  // read in C order
  EXPECT_TRUE(stored.at("fortran").is_contiguous());

  // Kuafu writes them back (the Fortran array as a C-ordered one); NumPy finds the script's arrays.
  write_npz(path("kuafu.npz"), stored);
  const testing::PythonRun checked = testing::run_python_reference("npz_reference.py", "check " + path("kuafu.npz"));
  EXPECT_EQ(checked.exit_code, 0) << checked.output;
  const NpzArrays again = read_npz(path("kuafu.npz"));
  for (const auto& [name, array] : stored) EXPECT_TRUE(torch::equal(array, again.at(name))) << name;
  EXPECT_TRUE(torch::equal(parse_npy(format_npy(stored.at("fortran").transpose(0, 2)), "transposed"),
                           stored.at("fortran").transpose(0, 2).contiguous()));
}

TEST_F(NpzTest, BadArchivesAndArraysAreNamed) {
  write_file_atomic(path("text.npz"), "not a zip archive");
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { read_npz(path("text.npz")); }), "text.npz: cannot open as an .npz"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { read_npz(path("absent.npz")); }), "absent.npz"));
  // An archive cut short: the central directory at its end is gone.
  write_npz(path("whole.npz"), {{"w", torch::ones({64, 64})}});
  const std::string whole = read_file(path("whole.npz"));
  write_file_atomic(path("cut.npz"), whole.substr(0, whole.size() / 2));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { read_npz(path("cut.npz")); }), "cut.npz"));
  // Arrays: a big-endian dtype, data shorter than the shape, a header that is not NumPy's.
  std::string array = format_npy(torch::ones({2, 3}));
  std::string big_endian = array;
  big_endian.replace(big_endian.find("<f4"), 3, ">f4");
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parse_npy(big_endian, "be.npy"); }), "be.npy: dtype '>f4'"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parse_npy(array.substr(0, array.size() - 4), "short.npy"); }),
                                "short.npy: 20 bytes of data where shape (2, 3) of <f4 needs 24"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { parse_npy("PK\x03\x04 not npy", "zip.npy"); }), "zip.npy: not a .npy"));
  EXPECT_TRUE(testing::Contains(testing::expected_error([&] { format_npy(torch::ones({2}, torch::kBFloat16)); }), "BFloat16"));
}

}  // namespace
}  // namespace kuafu::io
