#include "apps/stable_diffusion/emoji_recipe.h"

#include <nlohmann/json.hpp>
#ifdef KUAFU_WITH_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#endif

#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "core/io/json_file.h"
#include "core/io/png_file.h"
#include "core/util/atomic_file.h"
#include "core/util/error.h"
#include "core/util/text.h"

namespace kuafu::sd {

namespace fs = std::filesystem;

namespace {

const char* const kTones[] = {"1f3fb", "1f3fc", "1f3fd", "1f3fe", "1f3ff"};

// "emoji_u1f44b_1f3fd.png" -> "1f44b-1f3fd"; "" for another file.
std::string code_points_of(const fs::path& file) {
  const std::string stem = file.stem().string();
  if (file.extension() != ".png" || stem.rfind("emoji_u", 0) != 0) return "";
  std::string codes = stem.substr(7);
  for (char& c : codes) c = c == '_' ? '-' : c;
  return codes;
}

// The sequence without its tone modifier: the base emoji's code points (a modifier alone, the tone's
// swatch, is its own base).
std::string base_of(const std::string& code_points) {
  std::vector<std::string> kept;
  for (const std::string& part : text::split(code_points, '-')) {
    if (skin_tone_of(part) < 0) kept.push_back(part);
  }
  return kept.empty() ? code_points : text::join(kept, "-");
}

// The image composited onto white, as 8-bit RGB.
io::RgbImage on_white(const std::string& path) {
#ifndef KUAFU_WITH_IMAGE_CODECS
  fail("cannot read " + path + ": this build has no image decoding (KUAFU_WITH_IMAGE_CODECS=OFF)");
#else
  const cv::Mat image = cv::imread(path, cv::IMREAD_UNCHANGED);
  KUAFU_CHECK(!image.empty() && image.depth() == CV_8U, "cannot read ", path, " as an 8-bit image");
  io::RgbImage out{image.cols, image.rows, std::vector<uint8_t>(static_cast<size_t>(image.cols * image.rows * 3))};
  const int channels = image.channels();
  for (int y = 0; y < image.rows; ++y) {
    const uint8_t* row = image.ptr<uint8_t>(y);
    for (int x = 0; x < image.cols; ++x) {
      const uint8_t* px = row + x * channels;  // gray, BGR or BGRA
      const double alpha = channels == 4 ? px[3] / 255.0 : 1.0;
      for (int c = 0; c < 3; ++c) {
        const double value = channels < 3 ? px[0] : px[2 - c];
        out.pixels[static_cast<size_t>((y * image.cols + x) * 3 + c)] = static_cast<uint8_t>(std::lround(alpha * value + (1 - alpha) * 255));
      }
    }
  }
  return out;
#endif
}

}  // namespace

int skin_tone_of(const std::string& code_points) {
  for (const std::string& part : text::split(code_points, '-')) {
    for (int t = 0; t < 5; ++t) {
      if (part == kTones[t]) return t;
    }
  }
  return -1;
}

EmojiSplit write_emoji_folders(const std::string& package, const std::string& train_dir, const std::string& held_out_dir) {
  for (const std::string& dir : {train_dir, held_out_dir}) KUAFU_CHECK(!fs::exists(dir), dir, " already exists; prepare writes new folders");
  const fs::path index_file = fs::path(package) / "vendor/emojione-alpha-codes/eac.json";
  const fs::path images = fs::path(package) / "app/assets/images/tanuki_emoji";
  KUAFU_CHECK(fs::is_regular_file(index_file), "no emoji index at ", index_file.string(), " (is ruby-tanuki-emoji installed?)");
  KUAFU_CHECK(fs::is_directory(images), "no emoji images at ", images.string());
  const nlohmann::json index = io::read_json_object(index_file.string());
  // Each named image by its code points, in order; which tones each base comes in.
  std::map<std::string, std::pair<fs::path, std::string>> named;
  std::map<std::string, std::set<int>> tones;
  EmojiSplit split;
  for (const fs::directory_entry& entry : fs::directory_iterator(images)) {
    const std::string codes = code_points_of(entry.path());
    if (codes.empty()) continue;
    const auto found = index.find(codes);
    if (found == index.end() || !found->contains("name")) {
      ++split.unnamed;
      continue;
    }
    named[codes] = {entry.path(), (*found)["name"].get<std::string>()};
    if (const int tone = skin_tone_of(codes); tone >= 0 && base_of(codes) != codes) tones[base_of(codes)].insert(tone);
  }
  std::map<std::string, int> held_out_tone;  // the Latin square over the bases in all five tones
  for (const auto& [base, present] : tones) {
    if (present.size() == 5) held_out_tone[base] = static_cast<int>(split.toned_bases++ % 5);
  }
  auto is_held_out = [&](const std::string& codes) {
    const auto hold = held_out_tone.find(base_of(codes));
    return hold != held_out_tone.end() && base_of(codes) != codes && skin_tone_of(codes) == hold->second;
  };
  for (const auto& [codes, file_and_name] : named) ++(is_held_out(codes) ? split.held_out : split.train);
  KUAFU_CHECK(split.train > 0 && split.held_out > 0, package, " gave ", split.train, " training and ", split.held_out,
              " held-out emoji; it needs bases in all five skin tones");
  auto write_split = [&](const fs::path& building, bool held) {
    for (const auto& [codes, file_and_name] : named) {
      if (is_held_out(codes) != held) continue;
      const fs::path folder = building / base_of(codes);
      fs::create_directories(folder);
      const std::string stem = (folder / file_and_name.first.stem()).string();
      io::write_png(stem + ".png", on_white(file_and_name.first.string()));
      write_file_atomic(stem + ".txt", file_and_name.second);
    }
  };
  // The held-out folder is written inside the training folder's write, so a failure in either leaves neither.
  write_folder_atomic(train_dir, [&](const fs::path& train_building) {
    write_split(train_building, false);
    write_folder_atomic(held_out_dir, [&](const fs::path& held_building) { write_split(held_building, true); });
  });
  return split;
}

}  // namespace kuafu::sd
